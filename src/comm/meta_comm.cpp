#include "comm/meta_comm.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "tensor/error.h"

namespace fsdp {

namespace {

class MetaCommunicator final : public Communicator {
 public:
  MetaCommunicator(int size, int rank, const CommOptions& options, bool maps_node_memory)
      : Communicator(options), size_(size), rank_(rank), maps_node_memory_(maps_node_memory) {
    if (size < 1 || rank < 0 || rank >= size)
      throw Error("meta communicator: rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  std::string_view backend() const override { return "meta"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // A single (color, key) says nothing about the other ranks' colors.
  std::unique_ptr<Communicator> split(int, int) const override {
    throw Error("meta communicator: split(color, key) cannot know the group's size; use split_by");
  }
  std::unique_ptr<Communicator> split_by(const std::vector<int>& color_of_rank) const override {
    if (color_of_rank.size() != static_cast<size_t>(size_))
      throw Error("meta communicator: a partition of " + std::to_string(color_of_rank.size()) + " ranks for " +
                  std::to_string(size_));
    const int mine = color_of_rank[static_cast<size_t>(rank_)];
    const auto first = color_of_rank.begin();
    const int group_rank = static_cast<int>(std::count(first, first + rank_, mine));
    const int group_size = static_cast<int>(std::count(color_of_rank.begin(), color_of_rank.end(), mine));
    return std::make_unique<MetaCommunicator>(group_size, group_rank, options(), maps_node_memory_);
  }
  std::unique_ptr<Work> all_gather(const void*, void*, size_t, DType, Stream) override { return done(); }
  std::unique_ptr<Work> reduce_scatter(const void*, void*, size_t, DType, ReduceOp, Stream) override { return done(); }
  std::unique_ptr<Work> all_reduce(const void*, void*, size_t, DType, ReduceOp, Stream) override { return done(); }
  std::unique_ptr<Work> broadcast(void*, size_t, DType, int, Stream) override { return done(); }
  void barrier() override {}
  // Address space only (committed where written, which a plan never does); waits end at once.
  std::unique_ptr<NodeSharedMemory> share_node_memory(size_t bytes) override {
    if (!maps_node_memory_ || size_ < 2 || bytes == 0) return nullptr;
    return std::make_unique<MetaNodeMemory>(bytes);
  }

 private:
  class MetaNodeMemory final : public NodeSharedMemory {
   public:
    explicit MetaNodeMemory(size_t bytes) : bytes_(bytes) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<char*>(p);
    }
    MetaNodeMemory(const MetaNodeMemory&) = delete;  // owns a mapping
    MetaNodeMemory& operator=(const MetaNodeMemory&) = delete;
    ~MetaNodeMemory() override { munmap(data_, bytes_); }
    char* data() override { return data_; }
    size_t bytes() const override { return bytes_; }
    void wait(const std::function<bool()>&, const std::string&) override {}

   private:
    size_t bytes_;
    char* data_ = nullptr;
  };

  static std::unique_ptr<Work> done() { return std::make_unique<DoneWork>(); }
  int size_, rank_;
  bool maps_node_memory_;
};

}  // namespace

std::unique_ptr<Communicator> make_meta_communicator(int size, int rank, const CommOptions& options,
                                                     bool maps_node_memory) {
  return std::make_unique<MetaCommunicator>(size, rank, options, maps_node_memory);
}

}  // namespace fsdp
