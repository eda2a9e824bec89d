#include "comm/local.h"

#include <cstring>

namespace fsdp {

namespace {

class LocalCommunicator : public Communicator {
 public:
  explicit LocalCommunicator(const CommOptions& options) : Communicator(options) {}
  std::string_view backend() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<Communicator> split(int, int) const override {
    return std::make_unique<LocalCommunicator>(options());
  }
  std::unique_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype, Stream) override {
    copy(in, out, count, dtype);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp,
                                       Stream) override {
    copy(in, out, count, dtype);  // sum, avg, max and min of one value are the value
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp, Stream) override {
    copy(in, out, count, dtype);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> broadcast(void*, size_t, DType, int root, Stream) override {
    if (root != 0) throw Error("local broadcast: root " + std::to_string(root) + " outside [0, 1)");
    return std::make_unique<DoneWork>();
  }
  void barrier() override {}

 private:
  static void copy(const void* in, void* out, size_t count, DType dtype) {
    if (in != out && count) std::memmove(out, in, count * dtype_bytes(dtype));
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(const CommOptions& options) {
  return std::make_unique<LocalCommunicator>(options);
}

}  // namespace fsdp
