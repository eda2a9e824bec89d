#include "tensor/caching_allocator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace fsdp {

namespace {

// 1536 -> "1.5 KiB": one decimal is enough to tell categories apart in an OOM line; the exact
// request is printed in bytes next to it.
std::string human_bytes(size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  size_t i = 0;
  while (v >= 1024.0 && i + 1 < std::size(units)) {
    v /= 1024.0;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[i]);
  return buf;
}

std::string pointer_text(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", ptr);
  return buf;
}

// Streams and addresses are ordered by their integer values: std::less on unrelated pointers is
// total, but a tuple of them compares with the built-in <, which is not.
uintptr_t key_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

struct CachingAllocator::Segment {
  char* base = nullptr;
  size_t size = 0;
  bool small = false;
  // The stream the segment was obtained for: every block cut from it belongs to that stream's
  // free list, so neighbours that merge are always on one list.
  Stream stream;
  // Blocks by address: a block's neighbours in the segment are its neighbours in the map.
  std::map<char*, std::unique_ptr<Block>> blocks;
};

struct CachingAllocator::Block {
  enum class State : uint8_t { free, allocated, held };  // held: freed, waiting for events
  Segment* segment = nullptr;
  char* ptr = nullptr;
  size_t size = 0;  // rounded; what allocated_bytes counts
  State state = State::free;
  size_t requested = 0;  // what the tracker was charged
  MemCategory category = MemCategory::other;
  std::vector<Stream> used_on;  // record_stream's streams other than the segment's
};

struct CachingAllocator::Impl {
  // Best fit: the first block not below (stream, size, 0) is the smallest large-enough block on
  // that stream, the lowest address among equals (keeps reuse deterministic).
  struct FreeKey {
    uintptr_t stream;
    size_t size;
    uintptr_t address;
  };
  static FreeKey key(const Block* b) { return {key_of(b->segment->stream.native), b->size, key_of(b->ptr)}; }
  struct FreeOrder {
    using is_transparent = void;
    static std::tuple<uintptr_t, size_t, uintptr_t> tie(const FreeKey& k) { return {k.stream, k.size, k.address}; }
    bool operator()(const Block* a, const Block* b) const { return tie(key(a)) < tie(key(b)); }
    bool operator()(const Block* a, const FreeKey& b) const { return tie(key(a)) < tie(b); }
    bool operator()(const FreeKey& a, const Block* b) const { return tie(a) < tie(key(b)); }
  };
  using FreeSet = std::set<Block*, FreeOrder>;

  // A freed block used on other streams: it returns to its free list once all events are done.
  struct Held {
    Block* block;
    std::vector<std::unique_ptr<Event>> events;
  };

  Impl(RawDeviceMemory& r, MemoryTracker& t, const AllocatorOptions& o) : raw(r), tracker(t), options(o) {}

  RawDeviceMemory& raw;
  MemoryTracker& tracker;
  AllocatorOptions options;
  // Every public call locks, as PyTorch's allocator does: the runtime is one per process and
  // nothing stops two threads from freeing tensors; uncontended, the lock costs nanoseconds.
  mutable std::mutex mutex;
  std::map<uintptr_t, std::unique_ptr<Segment>> segments;  // by base address (owns() looks up)
  FreeSet small_free, large_free;
  std::unordered_map<const void*, Block*> in_use;
  std::vector<Held> held;
  std::array<size_t, kMemCategoryCount> allocated_by_category{};  // rounded bytes
  AllocatorStats stats;

  FreeSet& pool(const Block* b) { return b->segment->small ? small_free : large_free; }

  // b will also be used by work on `stream`; its own stream needs no event: reuse on that stream
  // is ordered after the work anyway.
  static void use_on(Block* b, Stream stream) {
    if (!(stream == b->segment->stream) && std::find(b->used_on.begin(), b->used_on.end(), stream) == b->used_on.end())
      b->used_on.push_back(stream);
  }

  Block* take_free(bool small, Stream stream, size_t size) {
    FreeSet& set = small ? small_free : large_free;
    auto it = set.lower_bound(FreeKey{key_of(stream.native), size, 0});
    if (it == set.end() || !((*it)->segment->stream == stream)) return nullptr;
    Block* b = *it;
    set.erase(it);
    return b;
  }

  // A fresh segment as one block, not on any free list (the caller uses it at once).
  Block* add_segment(void* base, size_t size, bool small, Stream stream) {
    auto seg = std::make_unique<Segment>();
    seg->base = static_cast<char*>(base);
    seg->size = size;
    seg->small = small;
    seg->stream = stream;
    auto block = std::make_unique<Block>();
    block->segment = seg.get();
    block->ptr = seg->base;
    block->size = size;
    Block* b = block.get();
    seg->blocks.emplace(b->ptr, std::move(block));
    segments.emplace(key_of(base), std::move(seg));
    ++stats.device_mallocs;
    stats.reserved_bytes += size;
    stats.peak_reserved_bytes = std::max(stats.peak_reserved_bytes, stats.reserved_bytes);
    return b;
  }

  // Cuts `size` off the front of b; the rest becomes a free block when it is big enough to be
  // worth keeping. Large pool: not below 1 MiB (PyTorch's rule), so a large block never turns
  // into slivers that only small requests, served by the other pool, could use.
  void split(Block* b, size_t size) {
    size_t rest = b->size - size;
    if (rest < (b->segment->small ? kRound : kSmallLimit)) return;
    auto tail = std::make_unique<Block>();
    tail->segment = b->segment;
    tail->ptr = b->ptr + size;
    tail->size = rest;
    b->size = size;
    Block* t = tail.get();
    b->segment->blocks.emplace(t->ptr, std::move(tail));
    pool(t).insert(t);
  }

  // b was just freed (or its events completed): merge with free neighbours, back on the list.
  void release(Block* b) {
    b->state = Block::State::free;
    auto& blocks = b->segment->blocks;
    FreeSet& set = pool(b);
    auto it = blocks.find(b->ptr);
    if (auto next = std::next(it); next != blocks.end() && next->second->state == Block::State::free) {
      set.erase(next->second.get());
      b->size += next->second->size;
      blocks.erase(next);
    }
    if (it != blocks.begin()) {
      auto prev = std::prev(it);
      Block* p = prev->second.get();
      if (p->state == Block::State::free) {
        set.erase(p);  // before its size changes: the set is ordered by size
        p->size += b->size;
        blocks.erase(it);  // destroys b
        b = p;
      }
    }
    set.insert(b);
  }

  // Non-blocking: blocks whose events have all completed go back to their free lists.
  void poll_events() {
    for (size_t i = 0; i < held.size();) {
      auto& events = held[i].events;
      std::erase_if(events, [](const std::unique_ptr<Event>& e) { return e->done(); });
      if (events.empty()) {
        release(held[i].block);
        held[i] = std::move(held.back());
        held.pop_back();
      } else {
        ++i;
      }
    }
  }

  void empty_cache() {
    // Held blocks come back only when their events complete; on a GPU they do, as the streams
    // drain. Yield rather than sleep: the wait is usually short and the host has nothing to do.
    // Bounded: a stream that never completes (a hung collective) must turn into an error that
    // names it (throw_oom), not a spin.
    poll_events();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.held_wait_s);
    while (!held.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
      poll_events();
    }
    std::erase_if(segments, [&](const auto& entry) {
      Segment& seg = *entry.second;
      Block* only = seg.blocks.size() == 1 ? seg.blocks.begin()->second.get() : nullptr;
      if (!only || only->state != Block::State::free) return false;
      pool(only).erase(only);
      raw.free(seg.base);
      ++stats.device_frees;
      stats.reserved_bytes -= seg.size;
      return true;
    });
  }

  std::string summary() const {
    std::string parts;
    for (size_t c = 0; c < kMemCategoryCount; ++c) {
      if (!allocated_by_category[c]) continue;
      if (!parts.empty()) parts += ", ";
      parts +=
          std::string(mem_category_name(static_cast<MemCategory>(c))) + ' ' + human_bytes(allocated_by_category[c]);
    }
    std::string s = "allocated " + human_bytes(stats.allocated_bytes);
    if (!parts.empty()) s += " (" + parts + ")";
    s += ", reserved " + human_bytes(stats.reserved_bytes);
    s += ", cached " + human_bytes(stats.reserved_bytes - stats.allocated_bytes);
    return s;
  }

  [[noreturn]] void throw_oom(size_t bytes, MemCategory category) const {
    std::string held_note;
    if (!held.empty()) {
      size_t held_bytes = 0;
      for (const Held& h : held) held_bytes += h.block->size;
      char wait[32];
      std::snprintf(wait, sizeof wait, "%g", options.held_wait_s);
      held_note = "; " + std::to_string(held.size()) + (held.size() == 1 ? " freed block" : " freed blocks") + " (" +
                  human_bytes(held_bytes) + ") still waiting for other streams' work after " + wait + " s";
    }
    throw OutOfMemory("out of device memory: cannot allocate " + std::to_string(bytes) + " bytes (" +
                      human_bytes(bytes) + ") for " + std::string(mem_category_name(category)) + "; " + summary() +
                      held_note);
  }
};

CachingAllocator::CachingAllocator(RawDeviceMemory& raw, MemoryTracker& tracker, AllocatorOptions options)
    : impl_(std::make_unique<Impl>(raw, tracker, options)) {}

CachingAllocator::~CachingAllocator() {
  Impl& m = *impl_;
  // Blocks still in use here are a caller's bug (a tensor outliving its runtime). Their memory
  // goes back with the segment; the tracker is credited so what it reports afterwards is true;
  // and a later deallocate of them would be undefined, so say so once.
  if (!m.in_use.empty()) {
    size_t bytes = 0;
    for (const auto& [ptr, b] : m.in_use) {
      m.tracker.on_free(b->category, b->requested, MemSpace::device);
      bytes += b->size;
    }
    std::fprintf(stderr, "warning: device caching allocator destroyed with %zu blocks (%s) still in use\n",
                 m.in_use.size(), human_bytes(bytes).c_str());
  }
  // Pending events are dropped unwaited: freeing the memory is the device's own synchronisation
  // point (cudaFree waits for the device), and a destructor must not spin.
  m.held.clear();
  for (auto& [base, seg] : m.segments) {
    try {
      m.raw.free(seg->base);
    } catch (...) {  // a failing free cannot be acted on in a destructor: free the rest
    }
  }
}

void* CachingAllocator::allocate(size_t bytes, MemCategory category, Stream stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  m.poll_events();
  // Beyond this no segment size can be computed (and no device has the room).
  if (bytes > std::numeric_limits<size_t>::max() - kLargeRound) m.throw_oom(bytes, category);
  // Zero bytes still gets a block: callers hand every pointer back to deallocate.
  size_t size = bytes ? round_up(bytes, kRound) : kRound;
  bool small = size <= kSmallLimit;
  Block* b = m.take_free(small, stream, size);
  const size_t segment_size = small ? kSmallSegment : round_up(size, kLargeRound);
  void* base = b ? nullptr : m.raw.malloc(segment_size);
  if (!b && !base) {
    // Cached segments of every stream and pool go back to the device, then one more try.
    // Waiting for held blocks may also return one that fits this stream: use it first.
    ++m.stats.oom_retries;
    m.empty_cache();
    b = m.take_free(small, stream, size);
    if (!b) base = m.raw.malloc(segment_size);
    if (!b && !base) m.throw_oom(bytes, category);
  }
  if (b)
    ++m.stats.cache_hits;
  else
    b = m.add_segment(base, segment_size, small, stream);
  m.split(b, size);
  b->state = Block::State::allocated;
  b->requested = bytes;
  b->category = category;
  m.in_use.emplace(b->ptr, b);
  m.stats.allocated_bytes += b->size;
  m.stats.peak_allocated_bytes = std::max(m.stats.peak_allocated_bytes, m.stats.allocated_bytes);
  m.allocated_by_category[static_cast<size_t>(category)] += b->size;
  m.tracker.on_alloc(category, bytes, MemSpace::device);
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr, Stream stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  auto it = m.in_use.find(ptr);
  if (it == m.in_use.end())
    throw Error("device allocator: deallocate of unknown pointer " + pointer_text(ptr) +
                " (not allocated here, or freed twice)");
  Block* b = it->second;
  // Freed with a stream other than its own: that stream's queued work may still use it, like a
  // record_stream; the block goes back to its own stream's list (where its neighbours are).
  Impl::use_on(b, stream);
  // The events first: if recording throws, the block is still in use and nothing has changed.
  Impl::Held held{b, {}};
  for (Stream s : b->used_on) held.events.push_back(m.raw.record(s));
  m.in_use.erase(it);
  m.stats.allocated_bytes -= b->size;
  m.allocated_by_category[static_cast<size_t>(b->category)] -= b->size;
  m.tracker.on_free(b->category, b->requested, MemSpace::device);
  b->used_on.clear();
  if (held.events.empty()) {
    m.release(b);
  } else {
    b->state = Block::State::held;
    m.held.push_back(std::move(held));
  }
}

void CachingAllocator::record_stream(void* ptr, Stream stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  auto it = m.in_use.find(ptr);
  if (it == m.in_use.end()) throw Error("device allocator: record_stream of unknown pointer " + pointer_text(ptr));
  Impl::use_on(it->second, stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(impl_->mutex);
  impl_->empty_cache();
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard lock(impl_->mutex);
  const auto& segments = impl_->segments;
  auto it = segments.upper_bound(key_of(ptr));
  if (it == segments.begin()) return false;
  --it;
  return key_of(ptr) < it->first + it->second->size;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  AllocatorStats s = impl_->stats;
  s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

std::string CachingAllocator::summary() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->summary();
}

}  // namespace fsdp
