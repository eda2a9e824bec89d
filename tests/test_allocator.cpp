// The device caching allocator's bookkeeping on the CPU: a fake RawDeviceMemory hands out host
// memory up to a capacity (so OOM can be provoked) and counts its calls, and its events complete
// when the test says so. Every test asserts exact addresses, sizes and counts.
#define BOOST_TEST_MODULE allocator
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/host_runtime.h"
#include "tensor/memory.h"

using namespace fsdp;

namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

// What the test controls about one recorded event: done once `done` is set or after
// `done_after_polls` queries (to see empty_cache wait for it).
struct EventState {
  Stream stream;
  bool done = false;
  int done_after_polls = -1;
  int polls = 0;
};

class FakeEvent : public Event {
 public:
  explicit FakeEvent(std::shared_ptr<EventState> state) : state_(std::move(state)) {}
  bool done() const override {
    ++state_->polls;
    if (state_->done_after_polls >= 0 && state_->polls >= state_->done_after_polls) state_->done = true;
    return state_->done;
  }

 private:
  std::shared_ptr<EventState> state_;
};

// Host memory as the device: at most `capacity` bytes of segments at once.
class FakeDevice : public RawDeviceMemory {
 public:
  explicit FakeDevice(size_t capacity) : capacity_(capacity) {}
  ~FakeDevice() override {
    for (auto& [ptr, bytes] : live) std::free(ptr);
  }
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  void* malloc(size_t bytes) override {
    ++malloc_calls;
    if (bytes > capacity_ - used) {
      ++failed_mallocs;
      return nullptr;
    }
    void* p = std::aligned_alloc(512, bytes);  // segment sizes are multiples of 2 MiB
    BOOST_TEST_REQUIRE(p != nullptr);
    live[p] = bytes;
    used += bytes;
    malloc_sizes.push_back(bytes);
    return p;
  }
  void free(void* ptr) override {
    ++free_calls;
    auto it = live.find(ptr);
    if (it == live.end()) {
      ++bad_frees;  // counted, not thrown: the allocator's destructor swallows exceptions
      return;
    }
    used -= it->second;
    freed_sizes.push_back(it->second);
    live.erase(it);
    std::free(ptr);
  }
  std::unique_ptr<Event> record(Stream stream) override {
    auto state = std::make_shared<EventState>();
    state->stream = stream;
    state->done_after_polls = events_done_after_polls;
    events.push_back(state);
    return std::make_unique<FakeEvent>(state);
  }

  int events_done_after_polls = -1;  // new events: complete on their own after this many polls
  size_t used = 0;
  int malloc_calls = 0, failed_mallocs = 0, free_calls = 0, bad_frees = 0;
  std::vector<size_t> malloc_sizes, freed_sizes;  // successful calls, in order
  std::map<void*, size_t> live;
  std::vector<std::shared_ptr<EventState>> events;

 private:
  size_t capacity_;
};

const Stream s1{reinterpret_cast<void*>(uintptr_t{0x1000})};
const Stream s2{reinterpret_cast<void*>(uintptr_t{0x2000})};

// Declaration order is destruction order reversed: the allocator goes first.
struct Env {
  explicit Env(size_t capacity = 256 * MiB, AllocatorOptions options = {})
      : dev(capacity), alloc(dev, tracker, options) {}
  FakeDevice dev;
  MemoryTracker tracker;
  CachingAllocator alloc;
  void* get(size_t bytes, Stream stream = s1, MemCategory c = MemCategory::other) {
    return alloc.allocate(bytes, c, stream);
  }
};

char* at(void* p, size_t offset) { return static_cast<char*>(p) + offset; }

std::string error_of_dealloc(CachingAllocator& a, void* p) {
  try {
    a.deallocate(p, s1);
  } catch (const OutOfMemory&) {
    return "OutOfMemory";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

BOOST_AUTO_TEST_CASE(sizes_round_to_512_bytes) {
  Env e;
  void* a = e.get(1);
  BOOST_TEST(e.alloc.stats().allocated_bytes == 512u);
  void* b = e.get(513);
  void* c = e.get(0);  // zero bytes still gets a block
  void* d = e.get(512);
  BOOST_TEST(b == at(a, 512));
  BOOST_TEST(c == at(a, 512 + 1024));
  BOOST_TEST(d == at(a, 512 + 1024 + 512));
  BOOST_TEST(e.alloc.stats().allocated_bytes == 512u + 1024u + 512u + 512u);
  BOOST_TEST(e.dev.malloc_sizes == std::vector<size_t>{2 * MiB});
  // The tracker sees what was asked for, not the rounding.
  BOOST_TEST(e.tracker.current_bytes(MemCategory::other) == 1u + 513u + 0u + 512u);
  for (void* p : {a, b, c, d}) e.alloc.deallocate(p, s1);
  BOOST_TEST(e.alloc.stats().allocated_bytes == 0u);
  BOOST_TEST(e.tracker.current_total_bytes() == 0u);
  // The peaks stay (max_memory_allocated / max_memory_reserved): the rounded sizes, the segment.
  BOOST_TEST(e.alloc.stats().peak_allocated_bytes == 512u + 1024u + 512u + 512u);
  BOOST_TEST(e.alloc.stats().peak_reserved_bytes == 2 * MiB);
}

BOOST_AUTO_TEST_CASE(small_and_large_pools) {
  Env e;
  // <= 1 MiB: 2 MiB small segments, shared.
  void* a = e.get(1 * MiB);
  void* b = e.get(1 * MiB);
  BOOST_TEST(b == at(a, 1 * MiB));
  BOOST_TEST(e.dev.malloc_sizes == std::vector<size_t>{2 * MiB});
  // Just over 1 MiB: large pool, segment rounded to 2 MiB; the 1 MiB - 512 B left is under 1 MiB,
  // so the block is not split and counts whole.
  void* c = e.get(1 * MiB + 1);
  BOOST_TEST(e.dev.malloc_sizes == (std::vector<size_t>{2 * MiB, 2 * MiB}));
  BOOST_TEST(e.alloc.stats().allocated_bytes == 4 * MiB);
  // 3 MiB: a 4 MiB segment, split (exactly 1 MiB left is kept as a free block).
  void* d = e.get(3 * MiB);
  BOOST_TEST(e.dev.malloc_sizes == (std::vector<size_t>{2 * MiB, 2 * MiB, 4 * MiB}));
  BOOST_TEST(e.alloc.stats().allocated_bytes == 7 * MiB);
  BOOST_TEST(e.alloc.stats().cached_bytes == 1 * MiB);
  // A small request does not take the large pool's free 1 MiB: a new small segment.
  void* f = e.get(4 * KiB);
  BOOST_TEST(e.dev.malloc_sizes == (std::vector<size_t>{2 * MiB, 2 * MiB, 4 * MiB, 2 * MiB}));
  BOOST_TEST(f != at(d, 3 * MiB));
  // And a large request does not take the small pool's free space.
  e.alloc.deallocate(f, s1);
  void* g = e.get(1 * MiB + 512 * KiB);
  BOOST_TEST(e.dev.malloc_sizes.size() == 5u);
  BOOST_TEST(e.dev.malloc_sizes.back() == 2 * MiB);
  BOOST_TEST(e.alloc.stats().reserved_bytes == 12 * MiB);
  for (void* p : {a, b, c, d, g}) e.alloc.deallocate(p, s1);
}

BOOST_AUTO_TEST_CASE(freed_block_is_reused_on_its_stream_without_a_device_malloc) {
  Env e;
  void* p = e.get(5 * MiB);
  e.alloc.deallocate(p, s1);
  void* q = e.get(5 * MiB);
  BOOST_TEST(q == p);
  BOOST_TEST(e.dev.malloc_calls == 1);
  BOOST_TEST(e.alloc.stats().cache_hits == 1u);
  // A smaller request on the stream is cut from the cached block too.
  void* s = e.get(700);
  e.alloc.deallocate(s, s1);
  void* t = e.get(700);
  BOOST_TEST(t == s);
  BOOST_TEST(e.dev.malloc_calls == 2);  // the small one needed its own segment once
  BOOST_TEST(e.dev.events.empty());     // same-stream reuse needs no event
  e.alloc.deallocate(q, s1);
  e.alloc.deallocate(t, s1);
}

BOOST_AUTO_TEST_CASE(freed_block_is_not_reused_by_another_stream) {
  Env e;
  void* p = e.get(4 * MiB, s1);
  e.alloc.deallocate(p, s1);
  void* q = e.get(4 * MiB, s2);
  BOOST_TEST(q != p);
  BOOST_TEST(e.dev.malloc_calls == 2);
  void* r = e.get(4 * MiB, s1);  // still cached for s1
  BOOST_TEST(r == p);
  BOOST_TEST(e.dev.malloc_calls == 2);
  // Small pool alike.
  void* a = e.get(100, s1);
  e.alloc.deallocate(a, s1);
  void* b = e.get(100, s2);
  BOOST_TEST(e.dev.malloc_calls == 4);
  BOOST_TEST(b != a);
  e.alloc.deallocate(q, s2);
  e.alloc.deallocate(r, s1);
  e.alloc.deallocate(b, s2);
}

BOOST_AUTO_TEST_CASE(record_stream_holds_the_block_until_its_event_completes) {
  Env e;
  void* p = e.get(4 * MiB, s1, MemCategory::gathered);
  e.alloc.record_stream(p, s2);
  e.alloc.record_stream(p, s1);      // its own stream: nothing to wait for
  e.alloc.record_stream(p, s2);      // once per stream
  BOOST_TEST(e.dev.events.empty());  // events are recorded at the free, not before
  e.alloc.deallocate(p, s1);
  BOOST_TEST_REQUIRE(e.dev.events.size() == 1u);
  BOOST_TEST(e.dev.events[0]->stream.native == s2.native);
  // Freed for the tracker and allocated_bytes at once; the memory stays reserved and cached.
  BOOST_TEST(e.tracker.current_bytes(MemCategory::gathered) == 0u);
  BOOST_TEST(e.alloc.stats().allocated_bytes == 0u);
  BOOST_TEST(e.alloc.stats().cached_bytes == 4 * MiB);

  void* q = e.get(4 * MiB, s1);  // p is held: a new segment
  BOOST_TEST(q != p);
  BOOST_TEST(e.dev.malloc_calls == 2);
  BOOST_TEST(e.dev.events[0]->polls >= 1);  // polled by that allocate

  e.dev.events[0]->done = true;
  void* r = e.get(4 * MiB, s1);  // polled, back on s1's list
  BOOST_TEST(r == p);
  BOOST_TEST(e.dev.malloc_calls == 2);
  e.alloc.deallocate(q, s1);
  e.alloc.deallocate(r, s1);
  BOOST_TEST(e.dev.events.size() == 1u);  // record_stream does not outlive the free
}

BOOST_AUTO_TEST_CASE(free_on_another_stream_waits_for_that_stream) {
  Env e;
  void* x = e.get(512, s1);
  e.alloc.deallocate(x, s2);
  BOOST_TEST_REQUIRE(e.dev.events.size() == 1u);
  BOOST_TEST(e.dev.events[0]->stream.native == s2.native);
  void* y = e.get(512, s1);
  BOOST_TEST(y == at(x, 512));  // x is held: cut from the rest of the segment
  e.dev.events[0]->done = true;
  void* z = e.get(512, s1);  // x is back on s1's list (its segment's stream), the best fit
  BOOST_TEST(z == x);
  BOOST_TEST(e.dev.malloc_calls == 1);
  e.alloc.deallocate(y, s1);
  e.alloc.deallocate(z, s1);
}

BOOST_AUTO_TEST_CASE(empty_cache_waits_for_held_blocks) {
  Env e;
  void* p = e.get(4 * MiB, s1);
  e.alloc.record_stream(p, s2);
  e.alloc.deallocate(p, s1);
  e.dev.events[0]->done_after_polls = 5;
  e.alloc.empty_cache();
  BOOST_TEST(e.dev.events[0]->polls == 5);
  BOOST_TEST(e.dev.free_calls == 1);
  BOOST_TEST(e.dev.live.empty());
  BOOST_TEST(e.alloc.stats().reserved_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(split_and_merge_in_the_large_pool) {
  Env e;
  void* x = e.get(6 * MiB);
  e.alloc.deallocate(x, s1);
  void* a = e.get(2 * MiB);
  void* b = e.get(2 * MiB);
  void* c = e.get(2 * MiB);
  BOOST_TEST(a == x);
  BOOST_TEST(b == at(x, 2 * MiB));
  BOOST_TEST(c == at(x, 4 * MiB));
  BOOST_TEST(e.dev.malloc_calls == 1);
  BOOST_TEST(e.alloc.stats().cache_hits == 3u);
  // A, then its neighbour B: one 4 MiB block again.
  e.alloc.deallocate(a, s1);
  e.alloc.deallocate(b, s1);
  void* ab = e.get(4 * MiB);
  BOOST_TEST(ab == x);
  BOOST_TEST(e.dev.malloc_calls == 1);
  // Backwards and forwards at once: C merges into AB before it; the whole segment fits 6 MiB.
  e.alloc.deallocate(ab, s1);
  e.alloc.deallocate(c, s1);
  void* all = e.get(6 * MiB);
  BOOST_TEST(all == x);
  BOOST_TEST(e.dev.malloc_calls == 1);
  e.alloc.deallocate(all, s1);
  e.alloc.empty_cache();
  BOOST_TEST(e.dev.freed_sizes == std::vector<size_t>{6 * MiB});
}

BOOST_AUTO_TEST_CASE(blocks_that_are_not_neighbours_do_not_merge) {
  Env e;
  void* x = e.get(6 * MiB);
  e.alloc.deallocate(x, s1);
  void* a = e.get(2 * MiB);
  void* b = e.get(2 * MiB);
  void* c = e.get(2 * MiB);
  e.alloc.deallocate(a, s1);
  e.alloc.deallocate(c, s1);
  BOOST_TEST(e.alloc.stats().cached_bytes == 4 * MiB);
  void* d = e.get(4 * MiB);  // 4 MiB cached, but in two pieces
  BOOST_TEST(e.dev.malloc_calls == 2);
  BOOST_TEST(d != x);
  // Two 2 MiB requests take the pieces, lowest address first.
  void* a2 = e.get(2 * MiB);
  void* c2 = e.get(2 * MiB);
  BOOST_TEST(a2 == a);
  BOOST_TEST(c2 == c);
  for (void* p : {a2, b, c2, d}) e.alloc.deallocate(p, s1);
}

BOOST_AUTO_TEST_CASE(split_and_merge_in_the_small_pool) {
  Env e;
  void* a = e.get(512 * KiB);
  void* b = e.get(512 * KiB);
  void* c = e.get(512 * KiB);
  BOOST_TEST(b == at(a, 512 * KiB));
  BOOST_TEST(c == at(a, 1 * MiB));
  // B, then A: A absorbs its free neighbour after it.
  e.alloc.deallocate(b, s1);
  e.alloc.deallocate(a, s1);
  void* m = e.get(1 * MiB);
  BOOST_TEST(m == a);
  BOOST_TEST(e.dev.malloc_calls == 1);
  // M, then C: C merges into M before it and the free rest after it; the segment is whole.
  e.alloc.deallocate(m, s1);
  e.alloc.deallocate(c, s1);
  BOOST_TEST(e.alloc.stats().cached_bytes == 2 * MiB);
  e.alloc.empty_cache();
  BOOST_TEST(e.dev.free_calls == 1);
  BOOST_TEST(e.alloc.stats().reserved_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(small_remainders_of_512_bytes_split_large_ones_under_1_mib_do_not) {
  Env e;
  void* a = e.get(2 * MiB - 512 - 1024);  // large pool: 2 MiB segment, 1.5 KiB left: not split
  BOOST_TEST(e.alloc.stats().allocated_bytes == 2 * MiB);
  void* b = e.get(1 * MiB - 512);  // small pool: split, 1 MiB + 512 B left
  void* c = e.get(1 * MiB);        // exactly 512 B left: split
  BOOST_TEST(c == at(b, 1 * MiB - 512));
  void* d = e.get(512);  // the last 512 B
  BOOST_TEST(d == at(b, 2 * MiB - 512));
  BOOST_TEST(e.dev.malloc_calls == 2);
  BOOST_TEST(e.alloc.stats().cached_bytes == 0u);
  for (void* p : {a, b, c, d}) e.alloc.deallocate(p, s1);
}

BOOST_AUTO_TEST_CASE(oom_empties_the_cache_and_retries) {
  Env e(8 * MiB);
  void* p = e.get(4 * MiB, s1);
  e.alloc.deallocate(p, s1);
  void* q = e.get(6 * MiB, s2);  // 4 cached + 6 > 8: the cached segment goes, then it fits
  BOOST_TEST(q != nullptr);
  BOOST_TEST(e.dev.failed_mallocs == 1);
  BOOST_TEST(e.dev.freed_sizes == std::vector<size_t>{4 * MiB});
  AllocatorStats s = e.alloc.stats();
  BOOST_TEST(s.oom_retries == 1u);
  BOOST_TEST(s.device_mallocs == 2u);
  BOOST_TEST(s.device_frees == 1u);
  BOOST_TEST(s.reserved_bytes == 6 * MiB);
  BOOST_TEST(s.peak_reserved_bytes == 6 * MiB);
  e.alloc.deallocate(q, s2);
}

BOOST_AUTO_TEST_CASE(oom_retry_waits_for_held_blocks) {
  Env e(6 * MiB);
  void* p = e.get(4 * MiB, s1);
  e.alloc.record_stream(p, s2);
  e.alloc.deallocate(p, s1);
  e.dev.events[0]->done_after_polls = 3;  // not done at allocate's first poll
  void* q = e.get(4 * MiB, s1);
  BOOST_TEST(e.dev.failed_mallocs == 1);
  BOOST_TEST(e.dev.events[0]->done);
  BOOST_TEST(e.alloc.stats().oom_retries == 1u);
  BOOST_TEST(e.alloc.stats().reserved_bytes == 4 * MiB);
  e.alloc.deallocate(q, s1);
}

BOOST_AUTO_TEST_CASE(oom_retry_does_not_wait_forever_for_a_stuck_stream) {
  // s2's work never completes (a hung collective): the retry waits held_wait_s, then the error
  // names the block it could not have.
  AllocatorOptions o;
  o.held_wait_s = 0.05;
  Env e(6 * MiB, o);
  void* p = e.get(4 * MiB, s1);
  e.alloc.record_stream(p, s2);
  e.alloc.deallocate(p, s1);
  std::string what;
  try {
    e.get(4 * MiB, s1);
  } catch (const OutOfMemory& x) {
    what = x.what();
  }
  BOOST_TEST(what ==
             "out of device memory: cannot allocate 4194304 bytes (4.0 MiB) for other; allocated 0 B, reserved "
             "4.0 MiB, cached 4.0 MiB; 1 freed block (4.0 MiB) still waiting for other streams' work after 0.05 s");
  BOOST_TEST(e.dev.events[0]->polls > 1);  // it did wait
  BOOST_TEST(e.alloc.stats().oom_retries == 1u);
  e.dev.events[0]->done = true;  // the stream completes after all: the block is usable again
  void* q = e.get(4 * MiB, s1);
  BOOST_TEST(q == p);
  e.alloc.deallocate(q, s1);
}

BOOST_AUTO_TEST_CASE(oom_after_the_retry_throws_one_line) {
  Env e(4 * MiB);
  void* a = e.get(1000000, s1, MemCategory::params);    // 1000448 B in a 2 MiB small segment
  void* b = e.get(1536 * KiB, s1, MemCategory::grads);  // large: 2 MiB, not split
  std::string what;
  try {
    e.get(3 * MiB, s1, MemCategory::activations);
  } catch (const OutOfMemory& x) {
    what = x.what();
  }
  BOOST_TEST(what ==
             "out of device memory: cannot allocate 3145728 bytes (3.0 MiB) for activations; allocated 3.0 MiB "
             "(params 977.0 KiB, grads 2.0 MiB), reserved 4.0 MiB, cached 1.0 MiB");
  BOOST_TEST(e.dev.failed_mallocs == 2);  // the try and the one retry
  BOOST_TEST(e.alloc.stats().oom_retries == 1u);
  BOOST_TEST(e.tracker.current_bytes(MemCategory::activations) == 0u);
  BOOST_TEST(e.tracker.peak_bytes(MemCategory::activations) == 0u);
  // Nothing changed: the small segment still serves.
  void* c = e.get(512, s1);
  BOOST_TEST(c == at(a, 1000448));
  BOOST_CHECK_THROW(e.get(std::numeric_limits<size_t>::max()), OutOfMemory);
  for (void* p : {a, b, c}) e.alloc.deallocate(p, s1);
}

BOOST_AUTO_TEST_CASE(tracker_is_charged_requested_bytes_per_category) {
  Env e;
  void* a = e.get(1000, s1, MemCategory::params);
  void* b = e.get(3000, s1, MemCategory::grads);
  void* c = e.get(5 * MiB + 1, s2, MemCategory::activations);
  BOOST_TEST(e.tracker.current_bytes(MemCategory::params) == 1000u);
  BOOST_TEST(e.tracker.current_bytes(MemCategory::grads) == 3000u);
  BOOST_TEST(e.tracker.current_bytes(MemCategory::activations) == 5 * MiB + 1);
  BOOST_TEST(e.tracker.current_total_bytes() == 4000 + 5 * MiB + 1);
  e.alloc.deallocate(c, s2);
  void* d = e.get(2000, s1, MemCategory::activations);
  BOOST_TEST(e.tracker.current_bytes(MemCategory::activations) == 2000u);
  BOOST_TEST(e.tracker.peak_bytes(MemCategory::activations) == 5 * MiB + 1);
  BOOST_TEST(e.tracker.peak_total_bytes() == 4000 + 5 * MiB + 1);
  for (void* p : {a, b, d}) e.alloc.deallocate(p, s1);
  BOOST_TEST(e.tracker.current_total_bytes() == 0u);
  BOOST_TEST(e.tracker.peak_bytes(MemCategory::params) == 1000u);
  BOOST_TEST(e.tracker.peak_bytes(MemCategory::grads) == 3000u);
}

BOOST_AUTO_TEST_CASE(stats_fields) {
  Env e;
  AllocatorStats s = e.alloc.stats();
  BOOST_TEST(s.allocated_bytes == 0u);
  BOOST_TEST(s.reserved_bytes == 0u);
  BOOST_TEST(s.device_mallocs == 0u);
  void* a = e.get(3 * MiB);  // 4 MiB segment
  void* b = e.get(1000);     // 2 MiB small segment
  void* c = e.get(1000);     // hit
  e.alloc.deallocate(a, s1);
  void* d = e.get(2 * MiB);  // hit: cut from a's block
  e.alloc.deallocate(d, s1);
  e.alloc.empty_cache();  // the 4 MiB segment goes
  s = e.alloc.stats();
  BOOST_TEST(s.allocated_bytes == 2048u);
  BOOST_TEST(s.reserved_bytes == 2 * MiB);
  BOOST_TEST(s.peak_reserved_bytes == 6 * MiB);
  BOOST_TEST(s.cached_bytes == 2 * MiB - 2048);
  BOOST_TEST(s.device_mallocs == 2u);
  BOOST_TEST(s.device_frees == 1u);
  BOOST_TEST(s.cache_hits == 2u);
  BOOST_TEST(s.oom_retries == 0u);
  BOOST_TEST(e.alloc.summary() == "allocated 2.0 KiB (other 2.0 KiB), reserved 2.0 MiB, cached 2.0 MiB");
  e.alloc.deallocate(b, s1);
  e.alloc.deallocate(c, s1);
  BOOST_TEST(e.alloc.summary() == "allocated 0 B, reserved 2.0 MiB, cached 2.0 MiB");
}

BOOST_AUTO_TEST_CASE(empty_cache_returns_every_unused_segment) {
  Env e;
  void* small_used = e.get(1000, s1);
  void* large_free = e.get(4 * MiB, s1);
  void* other_stream_free = e.get(6 * MiB, s2);
  void* split_used = e.get(3 * MiB, s1);  // 4 MiB segment, 1 MiB of it free
  e.alloc.deallocate(large_free, s1);
  e.alloc.deallocate(other_stream_free, s2);
  e.alloc.empty_cache();
  std::vector<size_t> freed = e.dev.freed_sizes;
  std::sort(freed.begin(), freed.end());  // segments go back in address order
  BOOST_TEST(freed == (std::vector<size_t>{4 * MiB, 6 * MiB}));
  BOOST_TEST(e.alloc.stats().reserved_bytes == 6 * MiB);
  BOOST_TEST(e.alloc.owns(small_used));
  BOOST_TEST(e.alloc.owns(at(split_used, 3 * MiB)));  // the free rest of a used segment stays
  BOOST_TEST(!e.alloc.owns(large_free));
  e.alloc.deallocate(small_used, s1);
  e.alloc.deallocate(split_used, s1);
  e.alloc.empty_cache();
  BOOST_TEST(e.dev.live.empty());
  BOOST_TEST(e.dev.free_calls == 4);
  BOOST_TEST(e.dev.bad_frees == 0);
  AllocatorStats s = e.alloc.stats();
  BOOST_TEST(s.reserved_bytes == 0u);
  BOOST_TEST(s.cached_bytes == 0u);
  BOOST_TEST(s.device_frees == s.device_mallocs);
}

BOOST_AUTO_TEST_CASE(destructor_returns_every_segment) {
  FakeDevice dev(256 * MiB);
  MemoryTracker tracker;
  {
    CachingAllocator alloc(dev, tracker);
    void* cached = alloc.allocate(4 * MiB, MemCategory::other, s1);
    alloc.deallocate(cached, s1);
    void* held = alloc.allocate(1000, MemCategory::comm, s2);
    alloc.record_stream(held, s1);
    alloc.deallocate(held, s2);                        // its event never completes
    alloc.allocate(3 * MiB, MemCategory::params, s2);  // leaked: a bug, counted and credited
    BOOST_TEST(dev.live.size() == 3u);
  }
  BOOST_TEST(dev.live.empty());
  BOOST_TEST(dev.free_calls == 3);
  BOOST_TEST(dev.bad_frees == 0);
  BOOST_TEST(tracker.current_total_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(unknown_pointers_are_errors) {
  Env e;
  int local = 0;
  BOOST_TEST(error_of_dealloc(e.alloc, &local) == "device allocator: deallocate of unknown pointer " +
                                                      pointer_text(&local) + " (not allocated here, or freed twice)");
  void* p = e.get(100);
  e.alloc.deallocate(p, s1);
  BOOST_TEST(error_of_dealloc(e.alloc, p) == "device allocator: deallocate of unknown pointer " + pointer_text(p) +
                                                 " (not allocated here, or freed twice)");
  // Inside a block is not the block.
  void* q = e.get(4096);
  BOOST_TEST(error_of_dealloc(e.alloc, at(q, 512)).find(pointer_text(at(q, 512))) != std::string::npos);
  BOOST_CHECK_THROW(e.alloc.record_stream(&local, s2), Error);
  e.alloc.deallocate(q, s1);
  BOOST_TEST(e.tracker.current_total_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(owns_is_true_inside_segments_only) {
  Env e;
  int local = 0;
  BOOST_TEST(!e.alloc.owns(&local));
  BOOST_TEST(!e.alloc.owns(nullptr));
  void* p = e.get(100);
  BOOST_TEST(e.alloc.owns(p));
  BOOST_TEST(e.alloc.owns(at(p, 2 * MiB - 1)));  // the free rest of its segment
  BOOST_TEST(!e.alloc.owns(at(p, 2 * MiB)));
  e.alloc.deallocate(p, s1);
  BOOST_TEST(e.alloc.owns(p));  // cached: still this device's memory
}

// Random traffic on two streams: live blocks never overlap (each is filled and checked), the
// stats and the tracker agree with what the test holds, and everything goes back at the end.
BOOST_AUTO_TEST_CASE(random_traffic_keeps_the_books) {
  Env e(64 * MiB);
  e.dev.events_done_after_polls = 4;  // an OOM retry waits for held blocks: they must complete
  std::mt19937 rng(7);
  struct Live {
    char* p;
    size_t bytes;
    Stream stream;
    unsigned char fill;
  };
  std::vector<Live> live;
  const size_t sizes[] = {1, 500, 4096, 100 * KiB, 1 * MiB, 1 * MiB + 1, 3 * MiB, 5 * MiB};
  auto rounded = [](size_t b) { return b ? (b + 511) / 512 * 512 : 512; };
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      size_t bytes = sizes[rng() % std::size(sizes)];
      Stream st = rng() % 2 ? s1 : s2;
      char* p = nullptr;
      try {
        p = static_cast<char*>(e.alloc.allocate(bytes, MemCategory::activations, st));
      } catch (const OutOfMemory&) {
        continue;
      }
      auto fill = static_cast<unsigned char>(step);
      std::memset(p, fill, bytes);
      live.push_back({p, bytes, st, fill});
    } else {
      size_t i = rng() % live.size();
      Live l = live[i];
      // Every byte still holds its fill: the first one, and each equal to the one before (one
      // memcmp; a byte loop took 45 s of the sanitizer build's 46 s suite at -O0 under ASan).
      BOOST_TEST_REQUIRE(static_cast<unsigned char>(l.p[0]) == l.fill);
      BOOST_TEST_REQUIRE(std::memcmp(l.p, l.p + 1, l.bytes - 1) == 0);
      if (rng() % 4 == 0) e.alloc.record_stream(l.p, l.stream == s1 ? s2 : s1);
      e.alloc.deallocate(l.p, l.stream);
      live[i] = live.back();
      live.pop_back();
    }
    for (auto& ev : e.dev.events)
      if (rng() % 3 == 0) ev->done = true;
    size_t want = 0, requested = 0;
    for (const Live& l : live) {
      requested += l.bytes;
      want += rounded(l.bytes);
    }
    AllocatorStats s = e.alloc.stats();
    // Unsplit large blocks count whole, so allocated is at least the rounded sum.
    BOOST_TEST_REQUIRE(s.allocated_bytes >= want);
    BOOST_TEST_REQUIRE(s.reserved_bytes == e.dev.used);
    BOOST_TEST_REQUIRE(e.tracker.current_total_bytes() == requested);
  }
  for (const Live& l : live) e.alloc.deallocate(l.p, l.stream);
  for (auto& ev : e.dev.events) ev->done = true;
  e.alloc.empty_cache();
  BOOST_TEST(e.dev.live.empty());
  BOOST_TEST(e.alloc.stats().allocated_bytes == 0u);
  BOOST_TEST(e.dev.bad_frees == 0);
}

// --- The host runtime's block cache (tensor/host_runtime.h): blocks of 1 MiB and up are mappings
// reused by size class (eight per power of two), never more cached than was once live together.
BOOST_AUTO_TEST_CASE(host_block_size_classes) {
  BOOST_TEST(HostBlockCache::rounded(1 * MiB) == 1 * MiB);
  BOOST_TEST(HostBlockCache::rounded(1 * MiB + 1) == 1 * MiB + 128 * KiB);
  BOOST_TEST(HostBlockCache::rounded(4 * MiB + 100) == 4 * MiB + 512 * KiB);
  BOOST_TEST(HostBlockCache::rounded(12 * MiB) == 12 * MiB);  // a class of its own: no slack
  for (size_t bytes = 1 * MiB; bytes < 64 * MiB; bytes = bytes * 9 / 8 + 4093) {
    const size_t c = HostBlockCache::rounded(bytes);
    BOOST_TEST((c >= bytes && c - bytes <= bytes / 8 && c % 4096 == 0), bytes << " -> " << c);
  }
}

BOOST_AUTO_TEST_CASE(host_blocks_reused_by_size_under_the_high_water_mark) {
  HostBlockCache cache;
  void* a = cache.take(4 * MiB);
  void* b = cache.take(4 * MiB + 100);  // the 4.5 MiB class
  BOOST_TEST(cache.live_bytes() == 8 * MiB + 512 * KiB);
  std::memset(a, 1, 4 * MiB);  // writable to the last byte
  cache.give(a, 4 * MiB);
  cache.give(b, 4 * MiB + 100);
  BOOST_TEST(cache.cached_bytes() == 8 * MiB + 512 * KiB);
  BOOST_TEST(cache.live_bytes() == 0u);
  // A step that asks for the same sizes again gets the same blocks, in either order; a request
  // a little larger, in the same class, too.
  void* b2 = cache.take(4 * MiB + 4096 * 10);
  void* a2 = cache.take(4 * MiB);
  BOOST_TEST(a2 == a);
  BOOST_TEST(b2 == b);
  BOOST_TEST(static_cast<unsigned char*>(a2)[4 * MiB - 1] == 1);  // a cached block keeps its pages
  cache.give(a2, 4 * MiB);
  cache.give(b2, 4 * MiB + 4096 * 10);
  // A class never seen: live (0) + cached (8.5 MiB) + 3 MiB passes the high-water mark (8.5 MiB)
  // plus its quarter of slack (10.625 MiB), so the largest cached block goes first; then it fits.
  void* c = cache.take(3 * MiB);
  BOOST_TEST(cache.cached_bytes() == 4 * MiB);
  BOOST_TEST(cache.live_bytes() == 3 * MiB);
  void* a3 = cache.take(4 * MiB);
  BOOST_TEST(a3 == a);
  BOOST_TEST(cache.cached_bytes() == 0u);
  cache.give(c, 3 * MiB);
  cache.give(a3, 4 * MiB);
  BOOST_TEST(cache.cached_bytes() == 7 * MiB);
  // The slack: cached 7 + 2 MiB = 9 MiB fits under 10.625 MiB, so nothing is unmapped. Then
  // cached 9 (4 + 3 + 2) + 2.5 MiB does not fit: the largest cached block (4 MiB) goes, and
  // 5 + 2.5 fits.
  void* d = cache.take(2 * MiB);
  BOOST_TEST(cache.cached_bytes() == 7 * MiB);
  BOOST_TEST(cache.live_bytes() == 2 * MiB);
  cache.give(d, 2 * MiB);
  void* e = cache.take(2 * MiB + 512 * KiB);
  BOOST_TEST(cache.cached_bytes() == 5 * MiB);  // 3 + 2 MiB left
  cache.give(e, 2 * MiB + 512 * KiB);
}

BOOST_AUTO_TEST_CASE(host_runtime_keeps_step_buffers_apart_from_small_allocations) {
  // The trace's case: every step allocates the same large buffers while small allocations that
  // outlive the step accumulate. The large buffers must come back at the same addresses.
  MemoryTracker tracker;
  std::unique_ptr<DeviceRuntime> rt = make_runtime(Device::cpu, tracker, 0);
  std::vector<void*> first;
  std::vector<std::unique_ptr<std::string>> kept;
  const size_t sizes[] = {12 * MiB, 3 * MiB + 8, 12 * MiB, 64 * KiB, 2 * MiB};
  for (int step = 0; step < 4; ++step) {
    std::vector<void*> blocks;
    for (size_t s : sizes) {
      blocks.push_back(rt->allocate(s, MemCategory::activations, rt->compute_stream()));
      kept.push_back(std::make_unique<std::string>(200, 'x'));
    }
    BOOST_TEST(tracker.current_bytes(MemCategory::activations) == 29 * MiB + 8 + 64 * KiB);
    for (size_t i = 0; i < blocks.size(); ++i) rt->deallocate(blocks[i], sizes[i], MemCategory::activations, {});
    if (step == 0 || !HostRuntime::uses_block_cache()) {  // ASan's malloc quarantines freed blocks
      first = blocks;
      continue;
    }
    std::vector<void*> large, large_first;
    for (size_t i = 0; i < blocks.size(); ++i)
      if (sizes[i] >= HostBlockCache::kMinBytes) large.push_back(blocks[i]), large_first.push_back(first[i]);
    std::sort(large.begin(), large.end());
    std::sort(large_first.begin(), large_first.end());
    BOOST_TEST(large == large_first, "step " << step << ": a large buffer came from a new mapping");
  }
  BOOST_TEST(tracker.current_bytes(MemCategory::activations) == 0u);
}
