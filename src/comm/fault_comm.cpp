#include "comm/fault_comm.h"

#include <cstdio>

namespace fsdp {

namespace {

class FaultyCommunicator final : public Communicator {
 public:
  FaultyCommunicator(std::unique_ptr<Communicator> inner, const CommFaults& faults, bool group)
      : Communicator(inner->options()), inner_(std::move(inner)), faults_(faults), group_(group) {}
  std::string_view backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Communicator> split(int color, int key) const override {
    return std::make_unique<FaultyCommunicator>(inner_->split(color, key), faults_, true);
  }
  std::unique_ptr<Communicator> split_by(const std::vector<int>& color_of_rank) const override {
    return std::make_unique<FaultyCommunicator>(inner_->split_by(color_of_rank), faults_, true);
  }
  std::unique_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype, Stream stream) override {
    return inner_->all_gather(in, out, count, dtype, stream);
  }
  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                       Stream stream) override {
    return inner_->reduce_scatter(in, out, count, dtype, op, stream);
  }
  std::unique_ptr<Work> all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                   Stream stream) override {
    if (group_ && faults_.drop_group_f32_all_reduce && dtype == DType::f32) return std::make_unique<DoneWork>();
    if (!group_ && count == 1 && dtype == DType::f64 && op == ReduceOp::sum && rank() == faults_.rank &&
        ++scalar_all_reduces_ == faults_.skip_scalar_all_reduce) {
      std::fprintf(stderr, "fsdp_app: rank %d: FSDP_TEST_FAULT: skipping the loss all_reduce of step %lld\n", rank(),
                   static_cast<long long>(scalar_all_reduces_));
      std::fflush(stderr);
      return std::make_unique<DoneWork>();
    }
    return inner_->all_reduce(in, out, count, dtype, op, stream);
  }
  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    return inner_->broadcast(buf, count, dtype, root, stream);
  }
  void barrier() override { inner_->barrier(); }

 private:
  std::unique_ptr<Communicator> inner_;
  CommFaults faults_;
  bool group_;  // split from the world
  int64_t scalar_all_reduces_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_faulty_communicator(std::unique_ptr<Communicator> inner, const CommFaults& faults) {
  return std::make_unique<FaultyCommunicator>(std::move(inner), faults, false);
}

}  // namespace fsdp
