#include "comm/meta_comm.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <set>

#include "tensor/error.h"

namespace fsdp {

namespace {

class MetaCommunicator final : public Communicator {
 public:
  // members: the world ranks of this group, in group order (the world: 0..size-1).
  MetaCommunicator(int size, int rank, const CommOptions& options, bool maps_node_memory,
                   std::shared_ptr<const MetaTiming> timing, std::vector<int> members)
      : Communicator(options),
        size_(size),
        rank_(rank),
        maps_node_memory_(maps_node_memory),
        timing_(std::move(timing)),
        members_(std::move(members)) {
    if (size < 1 || rank < 0 || rank >= size)
      throw Error("meta communicator: rank " + std::to_string(rank) + " of " + std::to_string(size));
    if (timing_) {
      if (timing_->node_of_rank.size() < members_.size())
        throw Error("meta communicator: node colors of " + std::to_string(timing_->node_of_rank.size()) +
                    " ranks for a group of " + std::to_string(members_.size()));
      std::set<int> nodes;
      for (int r : members_) nodes.insert(timing_->node_of_rank[static_cast<size_t>(r)]);
      nodes_ = static_cast<int>(nodes.size());
    }
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
    std::vector<int> members;
    for (int r = 0; r < size_; ++r)
      if (color_of_rank[static_cast<size_t>(r)] == mine) members.push_back(members_[static_cast<size_t>(r)]);
    const int group_size = static_cast<int>(members.size());
    return std::make_unique<MetaCommunicator>(group_size, group_rank, options(), maps_node_memory_, timing_,
                                              std::move(members));
  }
  std::unique_ptr<Work> all_gather(const void*, void*, size_t count, DType dtype, Stream stream) override {
    return timed(CollectiveKind::all_gather, count * size_, dtype, stream);
  }
  std::unique_ptr<Work> reduce_scatter(const void*, void*, size_t count, DType dtype, ReduceOp,
                                       Stream stream) override {
    return timed(CollectiveKind::reduce_scatter, count * size_, dtype, stream);
  }
  std::unique_ptr<Work> all_reduce(const void*, void*, size_t count, DType dtype, ReduceOp, Stream stream) override {
    return timed(CollectiveKind::all_reduce, count, dtype, stream);
  }
  std::unique_ptr<Work> broadcast(void*, size_t count, DType dtype, int, Stream stream) override {
    return timed(CollectiveKind::broadcast, count, dtype, stream);
  }
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

  // Complete at the collective's end on the timeline: a wait moves the waiting lane there.
  class TimedWork final : public Work {
   public:
    TimedWork(Timeline& timeline, double end_s) : timeline_(timeline), end_s_(end_s) {}
    bool test() override { return true; }
    void wait() override { timeline_.wait_until(Lane::host, end_s_); }
    void wait_on(Stream stream) override { timeline_.wait_until(timeline_.lane_of(stream.native), end_s_); }

   private:
    Timeline& timeline_;
    double end_s_;
  };

  // elements: the whole array (collective_cost.h's size).
  std::unique_ptr<Work> timed(CollectiveKind kind, size_t elements, DType dtype, Stream stream) {
    if (!timing_ || !timing_->timeline) return std::make_unique<DoneWork>();
    Timeline& t = *timing_->timeline;
    const double seconds =
        collective_seconds(kind, static_cast<double>(elements * dtype_bytes(dtype)), size_, nodes_, timing_->fabric);
    return std::make_unique<TimedWork>(t, t.collective(t.lane_of(stream.native), kind, seconds));
  }
  int size_, rank_;
  bool maps_node_memory_;
  std::shared_ptr<const MetaTiming> timing_;
  std::vector<int> members_;
  int nodes_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_meta_communicator(int size, int rank, const CommOptions& options,
                                                     bool maps_node_memory, std::shared_ptr<const MetaTiming> timing) {
  std::vector<int> world(static_cast<size_t>(std::max(size, 0)));
  for (int r = 0; r < size; ++r) world[static_cast<size_t>(r)] = r;
  return std::make_unique<MetaCommunicator>(size, rank, options, maps_node_memory, std::move(timing), std::move(world));
}

}  // namespace fsdp
