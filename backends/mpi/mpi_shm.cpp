#include "mpi/mpi_shm.h"

#include <sched.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "mpi/mpi_reduce.h"

namespace fsdp {

namespace {

// Ring geometry. A piece is one destination's part of one chunk; per rank the staging ring is
// slots x (n-1) pieces and the result ring slots x 1 piece. Measured (f32 reduce_scatter,
// 1-64 MiB, np 2 and 4, on the 2-core node shared with other jobs; ratio to raw MPI, medians):
// 64 KiB x 4 slots 0.2-2.6x, 256 KiB x 8 1.2-5.9x, 1 MiB x 8 2.0-6.7x, 4 MiB x 4 1.1-6.7x.
// Small cache-resident rings lose whenever a peer is descheduled: each rank can run ahead only
// by the ring, then waits a whole time slice. 1 MiB x 8 lets a rank stage up to 8 MiB per
// peer without waiting, which makes the pipeline tolerate a busy node.
constexpr size_t kPieceBytes = 1 << 20;
constexpr size_t kSlots = 8;
constexpr size_t kMinPieceBytes = 4 << 10;
constexpr size_t kAlignBytes = 4096;
// Per rank: bounds the window (and /dev/shm use) for many ranks per node: pieces shrink to fit,
// 16 MiB / (8 x n) (n=4: 512 KiB, n=8: 256 KiB).
constexpr size_t kRingBudgetBytes = 16 << 20;
// Pipeline depth inside one op. A slice no longer than a piece was one chunk, whose steps (stage,
// reduce and publish, copy the peers' results out) ran one after another with a wait on the
// peers between each: an all_reduce of 1 MiB at np 2 (0.5 MiB slices, 1 MiB pieces) ran at
// 0.3-0.5x raw MPI_Allreduce. Cut such an op into at least kMinChunksPerOp chunks, none under
// kMinChunkBytes (the per-chunk handshake costs about a cache miss per peer), so a rank reduces
// chunk k while its peers stage chunk k+1.
constexpr size_t kMinChunksPerOp = 4;
constexpr size_t kMinChunkBytes = 16 << 10;

}  // namespace

bool all_on_one_node(MPI_Comm comm) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return false;
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  // Either all ranks are on this node or none sees all of them.
  return node_size == size;
}

size_t dev_shm_free_bytes() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0) return SIZE_MAX;
  return static_cast<size_t>(fs.f_bavail) * fs.f_frsize;
}

bool node_oversubscribed(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) return false;
  int node_size = 1;
  MPI_Comm_size(node, &node_size);
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  CPU_ZERO(&all);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_SET(0, &mine);
  MPI_Allreduce(&mine, &all, static_cast<int>(sizeof mine), MPI_BYTE, MPI_BOR, node);
  MPI_Comm_free(&node);
  return node_size > CPU_COUNT(&all);
}

void ShmProgress::remove(ShmChannel* channel) {
  channels_.erase(std::remove(channels_.begin(), channels_.end(), channel), channels_.end());
}

bool ShmProgress::progress_all() {
  if (busy_ops_ == 0) return false;
  bool moved = false;
  for (ShmChannel* c : channels_) moved |= c->progress();
  return moved;
}

std::unique_ptr<ShmChannel> ShmChannel::create(MPI_Comm comm, std::shared_ptr<ShmProgress> progress) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  if (size < 2 || !all_on_one_node(comm)) return nullptr;

  std::unique_ptr<ShmChannel> ch(new ShmChannel());
  ch->rank_ = rank;
  ch->size_ = size;
  ch->slots_ = kSlots;
  const size_t pieces_per_rank = ch->slots_ * static_cast<size_t>(size);
  size_t piece = std::min(kPieceBytes, kRingBudgetBytes / pieces_per_rank);
  // Use at most a quarter of what is free in /dev/shm (dev_shm_free_bytes), agreed by all ranks,
  // or stay on MPI collectives.
  if (const size_t free_bytes = dev_shm_free_bytes(); free_bytes != SIZE_MAX)
    piece = std::min(piece, free_bytes / 4 / static_cast<size_t>(size) / pieces_per_rank);
  unsigned long agreed = piece / 64 * 64, mine_piece = agreed;  // every element size divides 64
  MPI_Allreduce(&mine_piece, &agreed, 1, MPI_UNSIGNED_LONG, MPI_MIN, comm);
  if (agreed < kMinPieceBytes) return nullptr;
  ch->piece_bytes_ = agreed;
  // Staging ring (n-1 pieces per slot) then result ring (one piece per slot).
  const size_t ring_bytes = ch->slots_ * static_cast<size_t>(size) * ch->piece_bytes_;

  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each segment on its own pages
  char* base = nullptr;
  // Segments come back only 8-byte aligned in Open MPI 4.1 (osc/sm); we align each one
  // ourselves. A mapping's offset within a page is the same in every process.
  int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(kAlignBytes + kControlBytes + ring_bytes), 1, info, comm,
                                   &base, &ch->win_);
  MPI_Info_free(&info);
  int ok = rc == MPI_SUCCESS ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) {
    // MPI_Win_free is collective and some ranks have no window: leak it rather than hang.
    ch->win_ = MPI_WIN_NULL;
    return nullptr;
  }
  auto align = [](void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return static_cast<char*>(p) + (kAlignBytes - a % kAlignBytes) % kAlignBytes;  // p's provenance kept
  };
  new (align(base)) Control{};
  ch->bases_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    MPI_Aint bytes = 0;
    int disp = 0;
    void* ptr = nullptr;
    MPI_Win_shared_query(ch->win_, r, &bytes, &disp, &ptr);
    ch->bases_[static_cast<size_t>(r)] = align(ptr);
  }
  // A passive-target epoch for the window's lifetime; the ring is synchronised by the C++
  // atomics in each segment's control block (acquire/release), which is what the unified
  // memory model of a shared window allows.
  MPI_Win_lock_all(MPI_MODE_NOCHECK, ch->win_);
  MPI_Barrier(comm);  // every control block is initialised before anyone reads it
  ch->progress_ = std::move(progress);
  ch->progress_->add(ch.get());
  return ch;
}

ShmChannel::~ShmChannel() {
  for (auto& o : queue_) o->channel = nullptr;
  if (progress_) {
    progress_->busy_ops_ -= queue_.size();
    progress_->remove(this);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);  // collective, like the MPI_Comm_free beside it
}

char* ShmChannel::slot(int writer, uint64_t chunk) const {
  const size_t ring_slot = static_cast<size_t>(chunk % slots_);
  return bases_[static_cast<size_t>(writer)] + kControlBytes +
         ring_slot * static_cast<size_t>(size_ - 1) * piece_bytes_;
}

char* ShmChannel::piece(int writer, uint64_t chunk, int dest) const {
  // A writer stages no piece for itself: dest's index skips the writer.
  const int index = dest < writer ? dest : dest - 1;
  return slot(writer, chunk) + static_cast<size_t>(index) * piece_bytes_;
}

char* ShmChannel::result(int writer, uint64_t chunk) const {
  const size_t staging = slots_ * static_cast<size_t>(size_ - 1) * piece_bytes_;
  return bases_[static_cast<size_t>(writer)] + kControlBytes + staging +
         static_cast<size_t>(chunk % slots_) * piece_bytes_;
}

bool ShmChannel::reached(Counter Control::*counter, uint64_t& cached, uint64_t need, bool include_self) {
  if (cached >= need) return true;
  uint64_t m = UINT64_MAX;
  for (int r = 0; r < size_; ++r)
    if (include_self || r != rank_) m = std::min(m, (control(r)->*counter).value.load(std::memory_order_acquire));
  cached = m;
  return cached >= need;
}

std::shared_ptr<ShmOp> ShmChannel::enqueue(ShmOp::Kind kind, const void* in, void* mine, void* full,
                                           std::vector<size_t> offsets, DType dtype, ReduceOp op) {
  if (!poisoned_.empty()) throw Error("mpi shared-memory channel unusable: " + poisoned_);
  auto o = std::make_shared<ShmOp>();
  o->kind = kind;
  o->in = static_cast<const char*>(in);
  o->mine = static_cast<char*>(mine);
  o->full = static_cast<char*>(full);
  o->offsets = std::move(offsets);
  o->dtype = dtype;
  o->op = op;
  o->esize = dtype_bytes(dtype);
  size_t longest = 0;
  for (size_t r = 0; r + 1 < o->offsets.size(); ++r) longest = std::max(longest, o->offsets[r + 1] - o->offsets[r]);
  // Every rank computes the same chunk_count (the offsets are the same everywhere), so the global
  // chunk numbering still agrees; a chunk smaller than a piece uses the front of its slot.
  const size_t align = 64 / o->esize;
  const size_t by_depth = ((longest + kMinChunksPerOp - 1) / kMinChunksPerOp + align - 1) / align * align;
  o->chunk_count = std::min(piece_bytes_ / o->esize, std::max(by_depth, kMinChunkBytes / o->esize));
  o->nchunks = (longest + o->chunk_count - 1) / o->chunk_count;
  o->first_chunk = next_chunk_;
  next_chunk_ += o->nchunks;
  o->channel = this;
  queue_.push_back(o);
  ++progress_->busy_ops_;
  return o;
}

// Step 1: stage this rank's pieces of chunk g for its peers.
bool ShmChannel::try_write(ShmOp& op) {
  const uint64_t g = op.first_chunk + op.written;
  if (!reached(&Control::consumed, min_consumed_, g + 1 > slots_ ? g + 1 - slots_ : 0, true))
    return false;  // a peer still reads this slot's previous chunk
  const size_t c0 = static_cast<size_t>(op.written) * op.chunk_count;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const size_t begin = op.offsets[static_cast<size_t>(r)], len = op.offsets[static_cast<size_t>(r) + 1] - begin;
    if (c0 >= len) continue;
    const size_t n = std::min(op.chunk_count, len - c0);
    std::memcpy(piece(rank_, g, r), op.in + (begin + c0) * op.esize, n * op.esize);
  }
  control(rank_)->posted.value.store(g + 1, std::memory_order_release);
  ++op.written;
  return true;
}

// Step 2: reduce this rank's slice of chunk g from every rank's staged piece; all_reduce
// publishes it in the result ring.
bool ShmChannel::try_reduce(ShmOp& op) {
  const uint64_t g = op.first_chunk + op.reduced;
  const bool publish = op.kind == ShmOp::Kind::all_reduce;
  if (!reached(&Control::posted, min_posted_, g + 1, false)) return false;  // a peer has not staged this chunk yet
  if (publish && !reached(&Control::gathered, min_gathered_, g + 1 > slots_ ? g + 1 - slots_ : 0, true))
    return false;  // a peer still copies this result slot's previous chunk
  const size_t me = static_cast<size_t>(rank_);
  const size_t c0 = static_cast<size_t>(op.reduced) * op.chunk_count;
  const size_t len = op.offsets[me + 1] - op.offsets[me];
  if (c0 < len) {
    const size_t n = std::min(op.chunk_count, len - c0);
    char* dst = op.mine + c0 * op.esize;
    const void* srcs[256];
    std::vector<const void*> many;
    const void** s = srcs;
    if (size_ > 256) {
      many.resize(static_cast<size_t>(size_));
      s = many.data();
    }
    for (int r = 0; r < size_; ++r)  // rank order: the same summation order on every rank
      s[r] = r == rank_ ? op.in + (op.offsets[me] + c0) * op.esize : piece(r, g, rank_);
    mpi_reduce_many(dst, s, static_cast<size_t>(size_), n, op.dtype, op.op);  // avg divides too
    if (publish) std::memcpy(result(rank_, g), dst, n * op.esize);
  }
  // Release order: the result chunk is visible before `reduced`, our reads are done before
  // `consumed` lets a writer reuse its staging slot. Each counter is stored by one step only,
  // and each step runs through the chunks in global order, so every counter only grows.
  control(rank_)->reduced.value.store(g + 1, std::memory_order_release);
  control(rank_)->consumed.value.store(g + 1, std::memory_order_release);
  ++op.reduced;
  return true;
}

// Step 3: copy the peers' result chunks of chunk g into the full buffer (all_reduce).
bool ShmChannel::try_gather(ShmOp& op) {
  const uint64_t g = op.first_chunk + op.gathered;
  if (op.kind == ShmOp::Kind::all_reduce) {
    if (!reached(&Control::reduced, min_reduced_, g + 1, false)) return false;
    const size_t c0 = static_cast<size_t>(op.gathered) * op.chunk_count;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const size_t begin = op.offsets[static_cast<size_t>(r)], len = op.offsets[static_cast<size_t>(r) + 1] - begin;
      if (c0 >= len) continue;
      const size_t n = std::min(op.chunk_count, len - c0);
      std::memcpy(op.full + (begin + c0) * op.esize, result(r, g), n * op.esize);
    }
  }
  control(rank_)->gathered.value.store(g + 1, std::memory_order_release);
  ++op.gathered;
  return true;
}

bool ShmChannel::progress() {
  bool any = false;
  for (;;) {
    bool moved = false;
    // Each step works on the first op with chunks left for it: a later op may start staging
    // while an earlier one still reduces or gathers (global chunk order is kept).
    for (auto& o : queue_)
      if (o->written < o->nchunks) {
        moved |= try_write(*o);
        break;
      }
    for (auto& o : queue_)
      if (o->reduced < o->written) {
        moved |= try_reduce(*o);
        break;
      } else if (o->reduced < o->nchunks) {
        break;
      }
    for (auto& o : queue_)
      if (o->gathered < o->reduced) {
        moved |= try_gather(*o);
        break;
      } else if (o->gathered < o->nchunks) {
        break;
      }
    if (!moved) break;
    any = true;
  }
  while (!queue_.empty() && queue_.front()->gathered == queue_.front()->nchunks) {
    std::shared_ptr<ShmOp> o = std::move(queue_.front());
    queue_.pop_front();
    --progress_->busy_ops_;
    o->channel = nullptr;
    o->done = true;
  }
  return any;
}

void ShmChannel::poison(const std::string& why) {
  if (poisoned_.empty()) poisoned_ = why;
  progress_->busy_ops_ -= queue_.size();
  for (auto& o : queue_) o->channel = nullptr;
  queue_.clear();
}

}  // namespace fsdp
