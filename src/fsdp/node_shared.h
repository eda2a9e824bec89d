#pragma once
// fsdp.node_shared_params: the ranks of a shard group that share a node keep one copy of every
// unit's full flat parameters in node-shared memory (Communicator::share_node_memory) and read
// the peers' slices in place instead of all_gathering them. The memory: per rank a pair of
// counters, then each unit's padded flat parameters (slice r is rank r's shard).
//
// The protocol, per rank. Versions count a rank's publications from 1; both counters only grow.
//   publish(write)     after this rank's shards changed (an optimizer step, a load): wait until
//                      every peer has released the previous version, write this rank's slices,
//                      then publish the new version
//   wait_for_peers()   before reading the copy: once per version, until every peer published it
//   shards_changing()  the shards may change: this rank reads the version it published no more
// So no rank reads a copy that is half old, half new, and a step waits for its peers once, not
// once a unit. FsdpEngine decides when (engine.cpp); this file is only the protocol.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace fsdp {

class NodeSharedParams {
 public:
  // Bytes of the node's copy for units of these padded sizes in a group of group_size ranks.
  static size_t bytes_for(int group_size, const std::vector<int64_t>& padded_numels);
  // Collective over the shard group: maps the copy, or null when the backend or the node cannot
  // (Communicator::share_node_memory returned none; every rank gets the same answer).
  static std::unique_ptr<NodeSharedParams> map(Communicator& group, const std::vector<int64_t>& padded_numels);

  size_t bytes() const { return memory_->bytes(); }
  float* unit(size_t index) const { return units_[index]; }  // padded_numel floats
  bool published() const { return version_ > 0; }
  bool needs_publish() const { return changed_; }  // the shards changed since the last publish
  uint64_t version() const { return version_; }

  void publish(const std::function<void()>& write_slices);
  // what: whose read waits, for the timeout's message ("of unit blocks.3 (forward)").
  void wait_for_peers(const std::string& what);
  void shards_changing();

 private:
  struct Counters;
  NodeSharedParams(Communicator& group, std::unique_ptr<NodeSharedMemory> memory,
                   const std::vector<int64_t>& padded_numels);
  Counters* counters() const;
  // Waits until every peer's `published` (or `released`) counter has reached `version`.
  void wait_for_all(bool published, uint64_t version, const std::string& what);

  Communicator& group_;
  std::unique_ptr<NodeSharedMemory> memory_;
  std::vector<float*> units_;
  uint64_t version_ = 0;          // of the shards this rank last published (0: none)
  bool changed_ = true;           // since this rank last published them
  bool peers_published_ = false;  // every peer has published version_
};

}  // namespace fsdp
