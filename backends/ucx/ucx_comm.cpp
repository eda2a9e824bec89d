#include "ucx/ucx_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "comm/reduce.h"

namespace fsdp {

namespace {

using ucx::Request;
using ucx::Worker;

constexpr uint32_t kPhaseReduceScatter = 1;
constexpr uint32_t kPhaseAllGather = 2;
constexpr uint32_t kPhaseBroadcast = 3;
constexpr uint32_t kPhaseBarrier = 4;
constexpr uint32_t kPhaseFinish = 5;
constexpr uint64_t kMessageLimit = uint64_t{1} << 28;

int mod(int a, int n) { return ((a % n) + n) % n; }

// What every algorithm needs to talk: the worker, the tag prefix of this collective, the ring.
struct Link {
  Worker* worker = nullptr;
  const CollectiveDesc* desc = nullptr;
  uint64_t tag_base = 0;
  int rank = 0, size = 1;

  int right() const { return (rank + 1) % size; }
  uint64_t tag(uint32_t phase, uint64_t message) const { return tag_base | (uint64_t{phase} << 28) | message; }
  // Zero-byte pieces (uneven all_reduce blocks) are skipped on both sides: the request stays
  // idle, which reads as complete.
  void send(int peer, uint32_t phase, uint64_t message, const void* data, size_t bytes, Request& request) const {
    if (bytes == 0) return;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    params.memory_type = UCS_MEMORY_TYPE_HOST;  // host buffers: spare UCX the memory-type lookup
    request.start(worker->get(), ucp_tag_send_nbx(worker->ep(peer), data, bytes, tag(phase, message), &params), *desc,
                  "ucp_tag_send_nbx");
  }
  void recv(uint32_t phase, uint64_t message, void* data, size_t bytes, Request& request) const {
    if (bytes == 0) return;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    params.memory_type = UCS_MEMORY_TYPE_HOST;
    request.start(worker->get(),
                  ucp_tag_recv_nbx(worker->get(), data, bytes, tag(phase, message), ~uint64_t{0}, &params), *desc,
                  "ucp_tag_recv_nbx");
  }
  void check_messages(uint64_t messages) const {
    if (messages >= kMessageLimit)
      throw Error(desc->text() + ": " + std::to_string(messages) + " ring messages exceed the tag's 2^28");
  }
};

// The ring's n blocks (block b ends on rank b) and their chunks. Chunk c of every block travels
// in "lane" c; blocks of uneven length (all_reduce with count % n != 0) have empty tail chunks.
struct Blocks {
  std::vector<size_t> start, len;  // elements
  size_t chunk = 1;                // elements per chunk
  size_t lanes = 0;                // chunks of the largest block

  Blocks(int n, size_t total, size_t chunk_elems) : start(static_cast<size_t>(n)), len(static_cast<size_t>(n)) {
    const size_t base = total / static_cast<size_t>(n), extra = total % static_cast<size_t>(n);
    for (size_t b = 0; b < static_cast<size_t>(n); ++b) {
      start[b] = b * base + std::min(b, extra);
      len[b] = base + (b < extra ? 1 : 0);
    }
    chunk = std::max<size_t>(1, chunk_elems);
    lanes = (len[0] + chunk - 1) / chunk;  // block 0 is a largest one
  }
  size_t chunk_start(int b, size_t c) const { return start[b] + c * chunk; }
  size_t chunk_len(int b, size_t c) const {
    const size_t off = c * chunk;
    return off >= len[b] ? 0 : std::min(chunk, len[b] - off);
  }
};

// Elements per chunk. A block is cut in at least kMinLanes chunks when that keeps chunks at or
// above kMinChunkBytes, so even a mid-size message pipelines across the ring's steps.
size_t chunk_elems(size_t block_elems, size_t wire_bytes, const UcxTuning& tuning) {
  constexpr size_t kMinLanes = 4;
  constexpr size_t kMinChunkBytes = size_t{32} << 10;
  size_t elems = std::max<size_t>(1, tuning.chunk_bytes / wire_bytes);
  size_t split = (block_elems + kMinLanes - 1) / kMinLanes;
  size_t floor = std::max<size_t>(1, kMinChunkBytes / wire_bytes);
  return std::min(elems, std::max(split, floor));
}

bool widens(DType dtype, ReduceOp op) {
  return (dtype == DType::bf16 || dtype == DType::f16) && (op == ReduceOp::sum || op == ReduceOp::avg);
}

// acc += widen(src): one step of a half-precision sum carried in f32.
void accumulate_wide(float* acc, const void* src, DType dtype, size_t count) {
  constexpr size_t kBlock = 1024;
  float tmp[kBlock];
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t n = std::min(kBlock, count - b);
    convert(s + b, dtype, tmp, DType::f32, n);
    for (size_t i = 0; i < n; ++i) acc[b + i] += tmp[i];
  }
}

// dst = round((acc + widen(src)) / divisor): the one rounding of a half-precision sum. dst may
// alias src.
void finish_wide(void* dst, const float* acc, const void* src, DType dtype, size_t count, int divisor) {
  constexpr size_t kBlock = 1024;
  float tmp[kBlock];
  const auto* s = static_cast<const uint16_t*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t n = std::min(kBlock, count - b);
    convert(s + b, dtype, tmp, DType::f32, n);
    if (divisor == 1) {
      for (size_t i = 0; i < n; ++i) tmp[i] += acc[b + i];
    } else {
      // Division, not multiplication by 1/n, to match scale_for_avg bit for bit.
      for (size_t i = 0; i < n; ++i) tmp[i] = (tmp[i] + acc[b + i]) / static_cast<float>(divisor);
    }
    convert(tmp, DType::f32, d + b, dtype, n);
  }
}

// One collective's state machine: advance() posts what has become possible and polls only its
// own requests; true once everything it started has completed.
class Algo {
 public:
  virtual ~Algo() = default;
  virtual bool advance() = 0;
  // Ranks this collective exchanged messages with (see UcxWork's closing handshake).
  virtual std::vector<int> peers() const = 0;
  // Whether a peer may need this rank's progress after this rank's own requests completed
  // (rendezvous transfers). The barrier's one-byte eager messages never do.
  virtual bool handshake() const { return true; }
};

// Sends and receives to/from the ring neighbours.
std::vector<int> ring_peers(const Link& link) {
  const int left = mod(link.rank - 1, link.size), right = link.right();
  return left == right ? std::vector<int>{right} : std::vector<int>{left, right};
}

// Staging slots borrowed from the worker's pool. Returned when the algorithm finished cleanly;
// after an abandoned transfer they are buried instead (UCX may still write into them).
class Staging {
 public:
  Staging(Worker& worker, size_t count) : worker_(worker) {
    for (size_t i = 0; i < count; ++i) slots_.push_back(worker.take_slot());
  }
  ~Staging() {
    for (auto& slot : slots_) {
      if (clean_) {
        worker_.give_slot(std::move(slot));
      } else {
        worker_.bury(std::move(slot));
      }
    }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  std::byte* operator[](size_t i) const { return slots_[i].get(); }
  void mark_clean() { clean_ = true; }

 private:
  Worker& worker_;
  std::vector<std::unique_ptr<std::byte[]>> slots_;
  bool clean_ = false;
};

// Ring all-gather over `blocks` of `out`. Every receive goes straight to its final place and is
// posted up front; a received chunk is forwarded as soon as it lands (zero-copy, from out).
// Lane c starts sending this rank's own chunk when lane_ready(c) says it is final.
class RingAllGather : public Algo {
 public:
  RingAllGather(const Link& link, std::byte* out, const Blocks& blocks, size_t elem_bytes, uint32_t phase)
      : link_(link), out_(out), blocks_(blocks), elem_bytes_(elem_bytes), phase_(phase) {
    const int n = link.size;
    const size_t lanes = blocks.lanes, messages = static_cast<size_t>(n - 1) * lanes;
    link.check_messages(messages);
    recv_ = std::vector<Request>(messages);
    send_ = std::vector<Request>(messages);
    next_.assign(lanes, 0);
    lanes_left_ = lanes;
    for (int s = 0; s < n - 1; ++s) {
      const int b = mod(link.rank - s - 1, n);
      for (size_t c = 0; c < lanes; ++c)
        link.recv(phase, s * lanes + c, at(b, c), blocks.chunk_len(b, c) * elem_bytes, recv_[s * lanes + c]);
    }
  }
  std::vector<int> peers() const override { return ring_peers(link_); }
  void lane_ready(size_t c) {
    link_.send(link_.right(), phase_, c, at(link_.rank, c), blocks_.chunk_len(link_.rank, c) * elem_bytes_, send_[c]);
    ++ready_;
  }
  bool advance() override {
    const int n = link_.size;
    const size_t lanes = blocks_.lanes;
    if (lanes_left_ > 0) {
      for (size_t c = 0; c < lanes; ++c) {
        int& s = next_[c];
        while (s < n - 1 && recv_[s * lanes + c].complete(*link_.desc)) {
          if (s + 1 < n - 1) {
            const int b = mod(link_.rank - s - 1, n);
            link_.send(link_.right(), phase_, (s + 1) * lanes + c, at(b, c), blocks_.chunk_len(b, c) * elem_bytes_,
                       send_[(s + 1) * lanes + c]);
          }
          if (++s == n - 1) --lanes_left_;
        }
      }
    }
    if (lanes_left_ > 0 || ready_ < lanes) return false;
    while (send_cursor_ < send_.size() && send_[send_cursor_].complete(*link_.desc)) ++send_cursor_;
    return send_cursor_ == send_.size();
  }

 private:
  std::byte* at(int b, size_t c) const { return out_ + blocks_.chunk_start(b, c) * elem_bytes_; }
  Link link_;
  std::byte* out_;
  Blocks blocks_;
  size_t elem_bytes_;
  uint32_t phase_;
  std::vector<Request> recv_, send_;  // index step * lanes + lane
  std::vector<int> next_;             // per lane: the step whose receive is awaited
  size_t lanes_left_ = 0, ready_ = 0, send_cursor_ = 0;
};

// Ring reduce-scatter: n-1 steps; at step s rank r sends its partial of block r-s-1 and
// receives block r-s-2's partial, which it reduces with its own contribution and forwards at
// step s+1; at the last step the received block is its own, finished into `mine`.
// Each active lane owns two staging slots used alternately (receive into one while the other
// is still being sent); at most `window` lanes are active, which bounds staging memory.
// No deadlock: every rank activates lanes in increasing order, and lane c depends only on
// lanes <= c.
class RingReduceScatter : public Algo {
 public:
  RingReduceScatter(const Link& link, const std::byte* in, std::byte* mine, const Blocks& blocks, DType dtype,
                    ReduceOp op, uint32_t phase, size_t window, std::function<void(size_t)> on_lane_done)
      : link_(link),
        in_(in),
        mine_(mine),
        blocks_(blocks),
        dtype_(dtype),
        op_(op),
        phase_(phase),
        wide_(widens(dtype, op)),
        elem_bytes_(dtype_bytes(dtype)),
        wire_bytes_(wide_ ? sizeof(float) : dtype_bytes(dtype)),
        on_lane_done_(std::move(on_lane_done)),
        staging_(*link.worker, 2 * std::max<size_t>(1, std::min(window, blocks.lanes))),
        lanes_(std::max<size_t>(1, std::min(window, blocks.lanes))) {
    link.check_messages(static_cast<size_t>(link.size - 1) * blocks.lanes);
    if (blocks.chunk * wire_bytes_ > link.worker->slot_bytes())
      throw Error(link.desc->text() + ": chunk larger than the staging slot");
  }

  std::vector<int> peers() const override { return ring_peers(link_); }
  bool advance() override {
    bool active = false;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      Lane& lane = lanes_[i];
      for (;;) {
        if (!lane.active) {
          if (next_lane_ == blocks_.lanes) break;
          activate(i, next_lane_++);
        }
        if (!step(i)) break;
        lane.active = false;  // finished: take the next chunk
      }
      active |= lane.active;
    }
    if (active || next_lane_ < blocks_.lanes) return false;
    staging_.mark_clean();
    return true;
  }

 private:
  struct Lane {
    size_t c = 0;
    int s = 0;  // the step whose receive comes next
    bool active = false, recv_posted = false;
    Request recv;
    Request send[2];  // send[p] reads slot p (send of step s uses slot (s+1)%2; step 0's may read `in`)
  };

  std::byte* slot(size_t lane, int parity) const { return staging_[2 * lane + static_cast<size_t>(parity)]; }
  const std::byte* own(int b, size_t c) const { return in_ + blocks_.chunk_start(b, c) * elem_bytes_; }

  void activate(size_t i, size_t c) {
    Lane& lane = lanes_[i];
    lane.c = c;
    lane.s = 0;
    lane.active = true;
    lane.recv_posted = false;
    const int b = mod(link_.rank - 1, link_.size);
    const size_t len = blocks_.chunk_len(b, c);
    const void* src = own(b, c);
    if (wide_) {
      convert(src, dtype_, slot(i, 1), DType::f32, len);
      src = slot(i, 1);
    }
    link_.send(link_.right(), phase_, c, src, len * wire_bytes_, lane.send[1]);
  }

  // Moves lane i as far as its requests allow; true once it is finished.
  bool step(size_t i) {
    Lane& lane = lanes_[i];
    const int n = link_.size;
    const size_t lanes = blocks_.lanes;
    const CollectiveDesc& desc = *link_.desc;
    while (lane.s < n - 1) {
      const int s = lane.s, parity = s & 1;
      const int b = mod(link_.rank - s - 2, n);  // the block arriving at step s
      const size_t len = blocks_.chunk_len(b, lane.c);
      std::byte* buf = slot(i, parity);
      if (!lane.recv_posted) {
        if (!lane.send[parity].complete(desc)) return false;  // step s-1's send still reads this slot
        link_.recv(phase_, s * lanes + lane.c, buf, len * wire_bytes_, lane.recv);
        lane.recv_posted = true;
      }
      if (!lane.recv.complete(desc)) return false;
      lane.recv_posted = false;
      if (s < n - 2) {
        accumulate(buf, own(b, lane.c), len);
        link_.send(link_.right(), phase_, (s + 1) * lanes + lane.c, buf, len * wire_bytes_, lane.send[parity]);
      } else {
        finish(mine_ + lane.c * blocks_.chunk * elem_bytes_, buf, own(b, lane.c), len);
        if (on_lane_done_) on_lane_done_(lane.c);
      }
      lane.s = s + 1;
    }
    return lane.send[0].complete(desc) && lane.send[1].complete(desc);
  }

  void accumulate(std::byte* acc, const std::byte* src, size_t len) const {
    if (wide_) {
      accumulate_wide(reinterpret_cast<float*>(acc), src, dtype_, len);
    } else {
      reduce_into(acc, src, len, dtype_, op_);
    }
  }

  void finish(std::byte* dst, const std::byte* acc, const std::byte* src, size_t len) const {
    const int divisor = op_ == ReduceOp::avg ? link_.size : 1;
    if (wide_) {
      finish_wide(dst, reinterpret_cast<const float*>(acc), src, dtype_, len, divisor);
      return;
    }
    const void* srcs[2] = {src, acc};  // dst may alias src (in-place all_reduce)
    reduce_many(dst, srcs, 2, len, dtype_, op_);
    if (divisor != 1) scale_for_avg(dst, len, dtype_, divisor);
  }

  Link link_;
  const std::byte* in_;
  std::byte* mine_;
  Blocks blocks_;
  DType dtype_;
  ReduceOp op_;
  uint32_t phase_;
  bool wide_;
  size_t elem_bytes_, wire_bytes_;
  std::function<void(size_t)> on_lane_done_;
  Staging staging_;          // before lanes_: outlives their requests
  std::vector<Lane> lanes_;  // the window
  size_t next_lane_ = 0;
};

// all_reduce = reduce_scatter + all_gather on one buffer. Lane c of the all-gather starts the
// moment lane c of the reduce-scatter has finished this rank's chunk, so the phases overlap.
class RingAllReduce : public Algo {
 public:
  RingAllReduce(const Link& link, const std::byte* in, std::byte* out, const Blocks& blocks, DType dtype, ReduceOp op,
                size_t window)
      : gather_(link, out, blocks, dtype_bytes(dtype), kPhaseAllGather),
        reduce_(link, in, out + blocks.start[static_cast<size_t>(link.rank)] * dtype_bytes(dtype), blocks, dtype, op,
                kPhaseReduceScatter, window, [this](size_t c) { gather_.lane_ready(c); }) {}
  std::vector<int> peers() const override { return gather_.peers(); }
  bool advance() override {
    if (!reduced_) reduced_ = reduce_.advance();
    return gather_.advance() && reduced_;
  }

 private:
  RingAllGather gather_;  // before reduce_: its callback targets gather_
  RingReduceScatter reduce_;
  bool reduced_ = false;
};

// Pipelined chain root -> root+1 -> ... -> root-1: each rank forwards chunk k while chunk k+1
// arrives. Receives are posted up front, straight into buf.
class ChainBroadcast : public Algo {
 public:
  ChainBroadcast(const Link& link, std::byte* buf, size_t bytes, int root, size_t chunk_bytes)
      : link_(link), buf_(buf), bytes_(bytes), chunk_(std::max<size_t>(1, chunk_bytes)) {
    position_ = mod(link.rank - root, link.size);
    chunks_ = (bytes + chunk_ - 1) / chunk_;
    link.check_messages(chunks_);
    recv_ = std::vector<Request>(chunks_);
    send_ = std::vector<Request>(chunks_);
    if (position_ == 0) {
      for (size_t c = 0; c < chunks_; ++c) forward(c);
      received_ = chunks_;
    } else {
      for (size_t c = 0; c < chunks_; ++c) link.recv(kPhaseBroadcast, c, buf + c * chunk_, len(c), recv_[c]);
    }
  }
  std::vector<int> peers() const override { return ring_peers(link_); }
  bool advance() override {
    while (received_ < chunks_ && recv_[received_].complete(*link_.desc)) {
      if (position_ < link_.size - 1) forward(received_);
      ++received_;
    }
    if (received_ < chunks_) return false;
    while (sent_ < chunks_ && send_[sent_].complete(*link_.desc)) ++sent_;
    return sent_ == chunks_;
  }

 private:
  size_t len(size_t c) const { return std::min(chunk_, bytes_ - c * chunk_); }
  void forward(size_t c) { link_.send(link_.right(), kPhaseBroadcast, c, buf_ + c * chunk_, len(c), send_[c]); }
  Link link_;
  std::byte* buf_;
  size_t bytes_, chunk_, chunks_ = 0, received_ = 0, sent_ = 0;
  int position_ = 0;
  std::vector<Request> recv_, send_;
};

// Dissemination barrier: in round k send to rank+2^k after hearing from rank-2^k in round k-1;
// ceil(log2 n) rounds.
class DisseminationBarrier : public Algo {
 public:
  explicit DisseminationBarrier(const Link& link) : link_(link) {
    while ((1 << rounds_) < link.size) ++rounds_;
    flags_.resize(static_cast<size_t>(rounds_));
    recv_ = std::vector<Request>(static_cast<size_t>(rounds_));
    send_ = std::vector<Request>(static_cast<size_t>(rounds_));
    for (int k = 0; k < rounds_; ++k) link.recv(kPhaseBarrier, static_cast<uint64_t>(k), &flags_[k], 1, recv_[k]);
    notify(0);
  }
  std::vector<int> peers() const override {
    std::vector<int> all;
    for (int k = 0; k < rounds_; ++k) {
      all.push_back(mod(link_.rank + (1 << k), link_.size));
      all.push_back(mod(link_.rank - (1 << k), link_.size));
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }
  bool handshake() const override { return false; }
  bool advance() override {
    while (round_ < rounds_ && recv_[round_].complete(*link_.desc)) {
      if (++round_ < rounds_) notify(round_);
    }
    if (round_ < rounds_) return false;
    for (Request& r : send_)
      if (!r.complete(*link_.desc)) return false;
    return true;
  }

 private:
  void notify(int k) {
    static const std::byte token{1};  // static: never freed under an abandoned send
    link_.send(mod(link_.rank + (1 << k), link_.size), kPhaseBarrier, static_cast<uint64_t>(k), &token, 1, send_[k]);
  }
  Link link_;
  int rounds_ = 0, round_ = 0;
  std::vector<std::byte> flags_;
  std::vector<Request> recv_, send_;
};

}  // namespace

// The handle a collective returns. Its state machine is enlisted with the family's progress:
// testing any collective advances all of them (see Context::progress_all), so a Work completes
// even while its rank is blocked in another one. Completion is read per request
// (ucp_request_check_status), so nothing writes into a Work from a callback.
class UcxWork final : public PollingWork, private ucx::Pollable {
 public:
  UcxWork(CollectiveDesc desc, double timeout_s, std::shared_ptr<Worker> worker, uint64_t tag_base, int rank, int size)
      : PollingWork(std::move(desc), timeout_s), worker_(std::move(worker)) {
    link_ = Link{worker_.get(), &desc_, tag_base, rank, size};
  }
  UcxWork(const UcxWork&) = delete;  // owns UCX requests in flight
  UcxWork& operator=(const UcxWork&) = delete;
  ~UcxWork() override {
    // A handle dropped before completion must not leave UCX writing into freed memory: finish
    // it (bounded by the timeout), then abandon what is still in flight.
    // After a timeout it has had its chance: do not block another timeout_s here.
    if (algo_ && !error_ && !timed_out_ && !worker_->closed()) {
      try {
        wait();
      } catch (...) {
      }
    }
    if (algo_) worker_->context().dismiss(this);
    algo_.reset();
  }
  const Link& link() const { return link_; }
  void run(std::unique_ptr<Algo> algo) {
    algo_ = std::move(algo);
    if (algo_->handshake()) {
      peers_ = algo_->peers();
      fin_recv_ = std::vector<Request>(peers_.size());
      fin_send_ = std::vector<Request>(peers_.size());
      fin_flags_.resize(peers_.size());
      for (size_t i = 0; i < peers_.size(); ++i)
        link_.recv(kPhaseFinish, static_cast<uint64_t>(peers_[i]), &fin_flags_[i], 1, fin_recv_[i]);
    }
    worker_->context().enlist(this);
  }
  bool test() override {
    unsigned events = 0;
    return poll(events);
  }

  // PollingWork's wait (spin 64 polls, yield, then sleep 50 us per poll) counts polls from the
  // start of the wait, so a long transfer spends most of it asleep while its peers wait for this
  // rank to forward the next chunk. Here the count restarts whenever UCX reports events: a rank
  // keeps polling while data moves and backs off (yield, then sleep) only once nothing has
  // happened for a while, which still hands the core to a peer that shares it.
  void wait() override {
    try {
      poll_until_deadline(desc_, timeout_s_, kBackoff, [this] {
        unsigned events = 0;
        const bool done = poll(events);
        return PollResult{done, events != 0};
      });
    } catch (const CommTimeout&) {
      timed_out_ = true;
      throw;
    }
  }

 private:
  void poll_quietly() noexcept override {
    if (!algo_ || error_ || worker_->closed()) return;  // a destroyed communicator's work: test() reports it
    try {
      // Closing handshake. Every request of this rank being complete does not mean its peers
      // are done with it: UCX may still owe them protocol messages it queued rather than sent
      // (a rendezvous acknowledgement, bytes awaiting a writable TCP socket), and those move
      // only while this rank progresses its worker. A rank that returned now and went on to
      // compute, or into an MPI call, could leave a peer waiting until its timeout. So each
      // rank tells its peers "done" (a one-byte eager message, sent once the data phase has
      // drained the connection) and completes only when they have said so too.
      // (ucp_ep_flush_nbx here instead deadlocked with UCX_TLS=tcp when ranks waited on
      // concurrent collectives in different orders.)
      if (stage_ == Stage::algorithm) {
        if (!algo_->advance()) return;
        static const std::byte token{1};  // static: never freed under an abandoned send
        for (size_t i = 0; i < peers_.size(); ++i)
          link_.send(peers_[i], kPhaseFinish, static_cast<uint64_t>(link_.rank), &token, 1, fin_send_[i]);
        stage_ = Stage::handshake;
      }
      for (Request& r : fin_recv_)
        if (!r.complete(desc_)) return;
      for (Request& r : fin_send_)
        if (!r.complete(desc_)) return;
      worker_->context().dismiss(this);
      algo_.reset();  // staging back to the pool now, not when the handle goes
    } catch (...) {
      error_ = std::current_exception();
      worker_->context().dismiss(this);
    }
  }

  // Spin 1024 idle polls (~0.3 ms), then yield until 16384, then sleep.
  static constexpr WaitBackoff kBackoff{.spin_polls = 1024, .yield_polls = 16384};

  bool poll(unsigned& events) {
    if (!algo_ && !error_) return true;
    if (!error_ && worker_->closed())
      throw Error(desc_.text() + ": the communicator was destroyed before this collective completed");
    if (!error_) events = worker_->context().progress_all();  // advances this work too
    if (error_) std::rethrow_exception(error_);
    return !algo_;
  }

  std::shared_ptr<Worker> worker_;
  Link link_;
  std::unique_ptr<Algo> algo_;  // null once complete
  std::exception_ptr error_;
  enum class Stage { algorithm, handshake } stage_ = Stage::algorithm;
  bool timed_out_ = false;
  std::vector<int> peers_;  // empty: no handshake
  std::vector<std::byte> fin_flags_;
  std::vector<Request> fin_recv_, fin_send_;
};

namespace {

size_t env_size(const char* name, size_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  unsigned long long parsed = std::strtoull(value, &end, 10);
  if (end == value || *end != '\0' || parsed == 0)
    throw Error(std::string(name) + "='" + value + "' is not a positive integer");
  return static_cast<size_t>(parsed);
}

}  // namespace

UcxCommunicator::UcxCommunicator(MPI_Comm owned, std::shared_ptr<ucx::Context> context, const CommOptions& options,
                                 UcxTuning tuning, uint8_t id, DevicePath path)
    : Communicator(options),
      comm_(owned),
      context_(std::move(context)),
      tuning_(tuning),
      id_(id),
      path_(std::move(path)) {
  MPI_Comm_rank(owned, &rank_);
  MPI_Comm_size(owned, &size_);
  worker_ = std::make_shared<Worker>(context_, owned, tuning_.chunk_bytes);
}

UcxCommunicator::~UcxCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  worker_->shutdown(finalized ? MPI_COMM_NULL : comm_.get(), options().timeout_s);
}

CollectiveDesc UcxCommunicator::describe(const char* collective, size_t count, DType dtype) {
  return {"ucx", collective, count, dtype, next_seq()};
}

std::unique_ptr<UcxWork> UcxCommunicator::make_work(CollectiveDesc desc) const {
  // 24 bits of sequence: collectives in flight together are never 16M calls apart.
  const uint64_t tag_base = (uint64_t{id_} << 56) | ((desc.seq & 0xFFFFFF) << 32);
  return std::make_unique<UcxWork>(std::move(desc), options().timeout_s, worker_, tag_base, rank_, size_);
}

std::unique_ptr<Communicator> UcxCommunicator::split(int color, int key) const {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(comm_.get(), color, key, &sub);
  const uint32_t index = splits_++;
  if (sub == MPI_COMM_NULL) return nullptr;  // MPI_UNDEFINED colour: not a member
  // Workers already separate communicators; the id in the tag makes a stray message visible
  // as unmatched rather than misdelivered. Equal on every member: parent id, split count, colour.
  const auto id = static_cast<uint8_t>(id_ * 131u + index * 31u + static_cast<uint32_t>(color) * 7u + 1u);
  return std::make_unique<UcxCommunicator>(sub, context_, options(), tuning_, id, path_);
}

std::unique_ptr<Work> UcxCommunicator::all_gather(const void* in, void* out, size_t count, DType dtype, Stream) {
  CollectiveDesc desc = describe("all_gather", count, dtype);
  const size_t eb = dtype_bytes(dtype);
  auto* out_bytes = static_cast<std::byte*>(out);
  std::byte* mine = out_bytes + static_cast<size_t>(rank_) * count * eb;
  if (count > 0 && mine != static_cast<const std::byte*>(in)) std::memcpy(mine, in, count * eb);
  if (count == 0 || size_ == 1) return std::make_unique<DoneWork>();
  auto work = make_work(std::move(desc));
  Blocks blocks(size_, count * static_cast<size_t>(size_), chunk_elems(count, eb, tuning_));
  auto algo = std::make_unique<RingAllGather>(work->link(), out_bytes, blocks, eb, kPhaseAllGather);
  for (size_t c = 0; c < blocks.lanes; ++c) algo->lane_ready(c);
  work->run(std::move(algo));
  return work;
}

std::unique_ptr<Work> UcxCommunicator::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                                      Stream) {
  CollectiveDesc desc = describe("reduce_scatter", count, dtype);
  if (count == 0) return std::make_unique<DoneWork>();
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, count * dtype_bytes(dtype));
    return std::make_unique<DoneWork>();
  }
  const size_t wire = widens(dtype, op) ? sizeof(float) : dtype_bytes(dtype);
  auto work = make_work(std::move(desc));
  Blocks blocks(size_, count * static_cast<size_t>(size_), chunk_elems(count, wire, tuning_));
  work->run(std::make_unique<RingReduceScatter>(work->link(), static_cast<const std::byte*>(in),
                                                static_cast<std::byte*>(out), blocks, dtype, op, kPhaseReduceScatter,
                                                tuning_.lanes, nullptr));
  return work;
}

std::unique_ptr<Work> UcxCommunicator::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                                  Stream) {
  CollectiveDesc desc = describe("all_reduce", count, dtype);
  if (count == 0) return std::make_unique<DoneWork>();
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, count * dtype_bytes(dtype));
    return std::make_unique<DoneWork>();
  }
  const size_t wire = widens(dtype, op) ? sizeof(float) : dtype_bytes(dtype);
  const size_t block = (count + static_cast<size_t>(size_) - 1) / static_cast<size_t>(size_);
  auto work = make_work(std::move(desc));
  Blocks blocks(size_, count, chunk_elems(block, wire, tuning_));
  work->run(std::make_unique<RingAllReduce>(work->link(), static_cast<const std::byte*>(in),
                                            static_cast<std::byte*>(out), blocks, dtype, op, tuning_.lanes));
  return work;
}

std::unique_ptr<Work> UcxCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Stream) {
  CollectiveDesc desc = describe("broadcast", count, dtype);
  if (root < 0 || root >= size_)
    throw Error(desc.text() + ": root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")");
  if (count == 0 || size_ == 1) return std::make_unique<DoneWork>();
  auto work = make_work(std::move(desc));
  work->run(std::make_unique<ChainBroadcast>(work->link(), static_cast<std::byte*>(buf), count * dtype_bytes(dtype),
                                             root, tuning_.chunk_bytes));
  return work;
}

void UcxCommunicator::barrier() {
  CollectiveDesc desc = describe("barrier", 0, DType::u8);
  if (size_ == 1) return;
  auto work = make_work(std::move(desc));
  work->run(std::make_unique<DisseminationBarrier>(work->link()));
  work->wait();
}

std::unique_ptr<Communicator> make_ucx_communicator(MPI_Comm bootstrap, const CommOptions& options) {
  UcxTuning tuning;
  unsigned long long values[2] = {env_size("FSDP_UCX_CHUNK_BYTES", tuning.chunk_bytes),
                                  env_size("FSDP_UCX_LANES", tuning.lanes)};
  // Chunk layout must agree on every rank, whatever each one's environment says.
  MPI_Bcast(values, 2, MPI_UNSIGNED_LONG_LONG, 0, bootstrap);
  tuning.chunk_bytes = std::max<size_t>(64, values[0]);
  tuning.lanes = values[1];
  auto context = std::make_shared<ucx::Context>();
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(bootstrap, &dup);  // our bootstrap traffic never matches the application's
  DevicePath path;
  if (options.runtime && options.runtime->device() == Device::cuda)
    path = agree_device_path(
        choose_device_path(options.device_buffers, context->device_support(), "the ucx rings reduce on the host"), dup);
  return std::make_unique<UcxCommunicator>(dup, std::move(context), options, tuning, 0, std::move(path));
}

}  // namespace fsdp
