#include "fsdp/node_shared.h"

#include <atomic>
#include <new>

namespace fsdp {

namespace {
size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }
}  // namespace

// Per rank, at the front of the memory; a cache line each, so no two ranks write one line.
struct alignas(64) NodeSharedParams::Counters {
  std::atomic<uint64_t> published{0};  // the version this rank's slices hold
  std::atomic<uint64_t> released{0};   // this rank reads no version up to this one any more
};

size_t NodeSharedParams::bytes_for(int group_size, const std::vector<int64_t>& padded_numels) {
  size_t bytes = round_up(static_cast<size_t>(group_size) * sizeof(Counters), 64);
  for (int64_t numel : padded_numels) bytes += round_up(static_cast<size_t>(numel) * sizeof(float), 64);
  return bytes;
}

std::unique_ptr<NodeSharedParams> NodeSharedParams::map(Communicator& group,
                                                        const std::vector<int64_t>& padded_numels) {
  std::unique_ptr<NodeSharedMemory> memory = group.share_node_memory(bytes_for(group.size(), padded_numels));
  if (!memory) return nullptr;
  return std::unique_ptr<NodeSharedParams>(new NodeSharedParams(group, std::move(memory), padded_numels));
}

NodeSharedParams::NodeSharedParams(Communicator& group, std::unique_ptr<NodeSharedMemory> memory,
                                   const std::vector<int64_t>& padded_numels)
    : group_(group), memory_(std::move(memory)) {
  char* base = memory_->data();
  new (base + static_cast<size_t>(group_.rank()) * sizeof(Counters)) Counters{};
  size_t offset = round_up(static_cast<size_t>(group_.size()) * sizeof(Counters), 64);
  for (int64_t numel : padded_numels) {
    units_.push_back(reinterpret_cast<float*>(base + offset));
    offset += round_up(static_cast<size_t>(numel) * sizeof(float), 64);
  }
  group_.barrier();  // every rank's counters exist before any rank reads them
}

NodeSharedParams::Counters* NodeSharedParams::counters() const { return reinterpret_cast<Counters*>(memory_->data()); }

void NodeSharedParams::wait_for_all(bool published, uint64_t version, const std::string& what) {
  Counters* c = counters();
  const int n = group_.size(), r = group_.rank();
  memory_->wait(
      [&] {
        for (int p = 0; p < n; ++p) {
          const std::atomic<uint64_t>& counter = published ? c[p].published : c[p].released;
          if (p != r && counter.load(std::memory_order_acquire) < version) return false;
        }
        return true;
      },
      what);
}

void NodeSharedParams::publish(const std::function<void()>& write_slices) {
  // Every unit at once: a peer ahead of this rank then finds them all ready, so a step waits for
  // the peers once instead of once per unit.
  if (version_ > 0)  // a peer may still read the slices of the last version
    wait_for_all(false, version_,
                 "until the peers release version " + std::to_string(version_) + " of the node-shared parameters");
  write_slices();
  version_ += 1;
  counters()[group_.rank()].published.store(version_, std::memory_order_release);
  changed_ = false;
  peers_published_ = false;
}

void NodeSharedParams::wait_for_peers(const std::string& what) {
  if (peers_published_) return;
  wait_for_all(true, version_,
               what + ": the peers' version " + std::to_string(version_) + " of the node-shared parameters");
  peers_published_ = true;
}

void NodeSharedParams::shards_changing() {
  // This rank reads the version it published no more: the peers may overwrite theirs.
  if (version_ > 0 && !changed_) counters()[group_.rank()].released.store(version_, std::memory_order_release);
  changed_ = true;
}

}  // namespace fsdp
