#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "comm/agree.h"
#include "fsdp/fsdp.h"
#include "fsdp/node_shared.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/meta_runtime.h"

namespace fsdp {

namespace {

std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

void bind_data(const FlatLayout& layout, float* data) {
  for (size_t i = 0; i < layout.params.size(); ++i) layout.params[i]->data = data ? data + layout.offsets[i] : nullptr;
}

void bind_grad(const FlatLayout& layout, float* grad) {
  for (size_t i = 0; i < layout.params.size(); ++i) layout.params[i]->grad = grad ? grad + layout.offsets[i] : nullptr;
}

CopyKind copy_kind(const DeviceRuntime& to, const DeviceRuntime& from) {
  const bool dev_to = to.device() != Device::cpu, dev_from = from.device() != Device::cpu;
  if (dev_to && dev_from) return CopyKind::device_to_device;
  if (dev_to) return CopyKind::host_to_device;
  return dev_from ? CopyKind::device_to_host : CopyKind::host_to_host;
}

// The engine's waits: a CommTimeout comes back naming the unit and phase the collective was for
// ("mpi all_gather of unit blocks.3 (backward prefetch) #84 ..."), which the collective layer's
// message (backend, collective, sequence number) cannot tell a user. unit null: every unit's
// shard at once (the replicate all_reduce).
void wait_on_naming(Work& work, Stream stream, const Unit* unit, const char* phase) {
  try {
    work.wait_on(stream);
  } catch (const CommTimeout& e) {
    const std::string what = unit ? "unit " + unit->spec.name : std::string("every unit's grad shard");
    throw e.for_purpose("of " + what + " (" + phase + ")");
  }
}

}  // namespace

void CollectiveCount::add(int64_t call_bytes, bool is_all_reduce) {
  calls += 1;
  bytes += call_bytes;
  wire_bytes += (is_all_reduce ? 2 : 1) * call_bytes * (group_size - 1) / group_size;
}

FsdpEngine::FsdpEngine(Model& model, Communicator& world, ProcessMesh mesh, const FsdpOptions& options,
                       MemoryTracker& mem, DeviceRuntime* runtime)
    : model_(model), world_(world), mesh_(std::move(mesh)), options_(options), mem_(mem) {
  if (!runtime) own_rt_ = make_runtime(Device::cpu, mem, 0);
  rt_ = runtime ? runtime : own_rt_.get();
  // Offloading means something only when compute is on a device: there the shards and the
  // optimizer state move to host memory (charged to the same tracker).
  // A plan (the meta device) offloads to a meta host: charged as host memory, never allocated.
  if (options.cpu_offload && rt_->device() != Device::cpu)
    host_rt_ = rt_->holds_values() ? make_runtime(Device::cpu, mem, 0) : make_meta_runtime(Device::cpu, mem);
  shard_rt_ = host_rt_ ? host_rt_.get() : rt_;
  for (DType d : {options.param_dtype, options.reduce_dtype})
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16)
      throw Error("fsdp.mixed_precision: " + std::string(dtype_name(d)) + " is not f32, bf16 or f16");
  const int64_t n = mesh_.shard->size();
  int64_t total = 0;
  for (UnitSpec& spec : apply_wrap_policy(model, options)) {
    auto u = std::make_unique<Unit>();
    u->layout = make_flat_layout(spec.params);
    u->spec = std::move(spec);
    u->padded_numel = (u->layout.numel + n - 1) / n * n;
    u->shard_numel = u->padded_numel / n;
    u->shard_offset = total;
    total += u->shard_numel;
    u->spec.module->set_hooked(true);
    // Activation checkpointing per unit: every wrapped (non-root) unit's subtree recomputes.
    if (!units_.empty()) u->spec.module->set_checkpointed(options.activation_checkpointing);
    unit_of_module_[u->spec.module] = static_cast<int>(units_.size());
    units_.push_back(std::move(u));
  }
  shards_ = Tensor::zeros(*shard_rt_, {total}, DType::f32, MemCategory::params);
  traffic_.all_gather.group_size = traffic_.reduce_scatter.group_size = mesh_.shard->size();
  traffic_.all_reduce.group_size = mesh_.replicate->size();
  if (options.node_shared_params) share_params_on_node();
}

void FsdpEngine::share_params_on_node() {
  std::string off;
  if (rt_->device() != Device::cpu)
    off = "it needs train.device: cpu";
  else if (mesh_.shard->size() < 2)
    off = "the shard group has one rank";
  else if (!mesh_.shard_group_on_one_node)
    off = "the shard group spans nodes";
  std::vector<int64_t> padded_numels;
  for (const auto& u : units_) padded_numels.push_back(u->padded_numel);
  const size_t bytes = NodeSharedParams::bytes_for(mesh_.shard->size(), padded_numels);
  // Every rank of the group takes the same branch (the conditions are the group's), so the
  // collective call below is made by all or none.
  if (off.empty()) {
    node_params_ = NodeSharedParams::map(*mesh_.shard, padded_numels);
    const std::string backend(mesh_.shard->backend());
    if (!node_params_ && backend != "mpi")
      off = "the " + backend + " backend maps no node-shared memory (the mpi backend does)";
    else if (!node_params_)
      off = "/dev/shm has no room for " + mib(bytes) + " (where the mpi backend maps it), or MPI sees the shard " +
            "group's ranks on different nodes";
  }
  if (!off.empty()) {
    node_params_note_ = "off: " + off + "; all_gathers as usual";
    return;
  }
  for (size_t i = 0; i < units_.size(); ++i) units_[i]->shared = node_params_->unit(i);
  const size_t n = static_cast<size_t>(mesh_.shard->size());
  node_params_charged_bytes_ = bytes / n;
  mem_.on_alloc(MemCategory::gathered, node_params_charged_bytes_);
  node_params_note_ = "on: the node's copy of the parameters, " + mib(bytes) + " in /dev/shm, " +
                      "read in place by the " + std::to_string(n) + " ranks of each shard group";
}

void FsdpEngine::shards_written() {
  if (!node_params_) return;
  if (node_params_->published() && !node_params_->needs_publish())
    for (const auto& u : units_)
      if (u->state != UnitState::sharded)
        throw Error("fsdp: internal: the shards may change while unit " + u->spec.name +
                    " is bound to the node-shared parameters");
  node_params_->shards_changing();
}

void FsdpEngine::publish_shards() {
  node_params_->publish([&] {
    if (!rt_->holds_values()) return;  // a plan: nothing to copy
    // bf16/f16 parameters: the slices hold the values rounded to param_dtype (in f32), which is
    // what the all_gather path computes with (its cast back to f32 is exact).
    const DType lowp = options_.param_dtype;
    const int64_t r = mesh_.shard->rank();
    int64_t most = 0;
    for (const auto& u : units_) most = std::max(most, u->shard_numel);
    std::vector<char> rounded(lowp == DType::f32 ? 0 : dtype_bytes(lowp) * static_cast<size_t>(most));
    for (const auto& u : units_) {
      float* slice = u->shared + r * u->shard_numel;
      const float* mine = shards_.f32() + u->shard_offset;
      if (lowp == DType::f32) {
        std::memcpy(slice, mine, static_cast<size_t>(u->shard_numel) * sizeof(float));
      } else {
        rt_->kernels().cast(rounded.data(), lowp, mine, DType::f32, u->shard_numel);
        rt_->kernels().cast(slice, DType::f32, rounded.data(), lowp, u->shard_numel);
      }
    }
  });
}

void FsdpEngine::comm_waits_for_compute() {
  if (rt_->device() == Device::cpu) return;  // one host thread: already in order
  rt_->wait(rt_->comm_stream(), *rt_->record(rt_->compute_stream()));
}

bool FsdpEngine::offloaded() const { return shard_rt_ != rt_; }

void FsdpEngine::write_shard(int64_t offset, const float* host, int64_t count) {
  Stream s = shard_rt_->compute_stream();
  shard_rt_->copy_async(shards_.f32() + offset, host, static_cast<size_t>(count) * sizeof(float),
                        shard_rt_->device() == Device::cpu ? CopyKind::host_to_host : CopyKind::host_to_device, s);
  shard_rt_->synchronize(s);  // `host` may be reused as soon as this returns
  shards_written();
}

FsdpEngine::~FsdpEngine() {
  // The model may outlive the engine (and be run without one): its modules stop calling out.
  for (auto& u : units_) {
    u->spec.module->set_hooked(false);
    u->spec.module->set_checkpointed(false);
  }
  // Outstanding collectives reference our buffers: finish them before the buffers go.
  for (auto& u : units_)
    if (u->pending_gather) try {
        u->pending_gather->wait();
      } catch (...) {
      }
  for (auto& p : pending_reductions_) try {
      p.work->wait();
    } catch (...) {
    }
  if (node_params_) {
    for (auto& u : units_)
      if (u->state != UnitState::sharded) bind_data(u->layout, nullptr);  // the mapping goes with us
    mem_.on_free(MemCategory::gathered, node_params_charged_bytes_);
  }
}

void FsdpEngine::init_shards(uint64_t seed) {
  if (!shard_rt_->holds_values()) return;  // the meta device of a plan: nothing to draw into
  const int64_t r = mesh_.shard->rank();
  // Initial values are drawn on the host (the counter RNG of nn/module.h), then copied over.
  const bool host = shard_rt_->device() == Device::cpu;
  std::vector<float> staging;
  for (auto& u : units_) {
    int64_t begin = r * u->shard_numel;
    if (host) {
      init_flat_range(u->layout, shards_.f32() + u->shard_offset, begin, begin + u->shard_numel, seed);
      continue;
    }
    staging.assign(static_cast<size_t>(u->shard_numel), 0.0f);
    init_flat_range(u->layout, staging.data(), begin, begin + u->shard_numel, seed);
    write_shard(u->shard_offset, staging.data(), u->shard_numel);
  }
  shards_written();
}

void FsdpEngine::load_full_weights(const WeightOpener& open) {
  // Rank 0 checks the whole file before anything is broadcast, and tells every rank whether it
  // may proceed: a bad file must not leave the other ranks waiting in a broadcast.
  std::vector<Param*> all;
  for (auto& u : units_) all.insert(all.end(), u->layout.params.begin(), u->layout.params.end());
  std::string message;
  WeightReader source;
  // A plan (the meta device) reads no file: it only allocates as the load does.
  const bool reads = rt_->holds_values();
  if (world_.rank() == 0 && reads) {
    try {
      source = open();
      source.check(all);
    } catch (const Error& e) {
      message = e.what();
    }
  }
  // Rank 0's verdict, on every rank (all fail with rank 0's message).
  if (const Agreement a = agree_on_error(world_, message); !a.ok()) throw Error(a.message);
  const int64_t r = mesh_.shard->rank();
  for (auto& u : units_) {
    // Every element is written before use: rank 0 reads the params and zeroes the padding, the
    // broadcast fills the others (so a plan's untouched buffer commits no memory).
    Tensor full = Tensor::empty({u->padded_numel}, DType::f32, MemCategory::other, &mem_);
    if (world_.rank() == 0 && reads) {
      std::fill(full.f32() + u->layout.numel, full.f32() + u->padded_numel, 0.0f);
      bind_data(u->layout, full.f32());
      source.read(u->layout.params);
      bind_data(u->layout, nullptr);
    }
    world_.broadcast(full.f32(), static_cast<size_t>(u->padded_numel), DType::f32, 0)->wait();
    write_shard(u->shard_offset, full.f32() + r * u->shard_numel, u->shard_numel);
  }
}

bool FsdpEngine::shard_is_the_unit() const {
  return mesh_.shard->size() == 1 && options_.param_dtype == DType::f32 && !offloaded();
}

bool FsdpEngine::keeps_params_after_forward(const Unit& u) const {
  // The root stays gathered from forward to backward (its layers open and close the pass);
  // ZeRO-2 style strategies keep every unit. A shard group of one rank reshards too, as FSDP2's
  // reshard_after_forward does at any mesh size, whenever unsharding made a copy (param_dtype
  // below f32, or cpu_offload): keeping every unit's f32 copy was 3.11 GiB of the performance
  // model's 24.41 GiB at np 1, for a cast per unit in the backward. Only where the shard is the
  // unit itself (f32, on the device) is there nothing to free.
  return index_of(u) == 0 || !reshards_after_forward(options_.strategy) || shard_is_the_unit();
}

Unit& FsdpEngine::unit_of(Module& module) {
  auto it = unit_of_module_.find(&module);
  if (it == unit_of_module_.end()) throw Error("fsdp: hook for a module that roots no unit: " + module.name());
  return *units_[it->second];
}

int FsdpEngine::index_of(const Unit& u) const {
  for (size_t i = 0; i < units_.size(); ++i)
    if (units_[i].get() == &u) return static_cast<int>(i);
  return -1;
}

void FsdpEngine::unshard(Unit& u, const char* phase) {
  if (u.state != UnitState::sharded) return;
  const auto span = trace_->scope(Track::host, "unshard", &u.spec.name);
  u.gather_phase = phase;
  const DType dtype = full_precision_gather_ ? DType::f32 : options_.param_dtype;
  if (node_params_ && dtype == options_.param_dtype) {  // the peers' slices read in place (share_params_on_node)
    if (node_params_->needs_publish()) publish_shards();
    node_params_->wait_for_peers("of unit " + u.spec.name + " (" + u.gather_phase + ")");
    bind_data(u.layout, u.shared);
    u.state = UnitState::gathered;
    return;
  }
  const int64_t n = mesh_.shard->size(), r = mesh_.shard->rank();
  const float* mine = shards_.f32() + u.shard_offset;
  if (n == 1 && dtype == DType::f32 && !offloaded()) {
    bind_data(u.layout, shards_.f32() + u.shard_offset);  // NO_SHARD: the shard is the whole unit
    u.state = UnitState::gathered;
    return;
  }
  if (n == 1 && !offloaded()) {
    // A shard group of one rank: the gather is the identity. The compute copy is the shard
    // rounded to param_dtype in place (the bits the cast, the all_gather and the cast back would
    // give), on the compute stream: no collective, no comm-stream work, nothing to wait for (one
    // launch and one copy instead of two casts and an NCCL call on a GPU).
    ensure(u.gathered, {u.padded_numel}, DType::f32, MemCategory::gathered, *rt_);
    u.gathered_lowp = Tensor();
    rt_->copy_async(u.gathered.raw(), mine, static_cast<size_t>(u.shard_numel) * sizeof(float),
                    copy_kind(*rt_, *shard_rt_), rt_->compute_stream());
    rt_->kernels().round_to(u.gathered.f32(), dtype, u.padded_numel);
    bind_data(u.layout, u.gathered.f32());
    u.state = UnitState::gathered;
    return;
  }
  // Streams: the gathered buffer may be a block compute used last (the caching allocator reuses
  // in compute-stream order), and a low-precision slot is written by a compute kernel; so the
  // comm stream first waits for compute's work so far. Compute waits for the all_gather in
  // wait_for_unshard. A prefetch issued here still overlaps the kernels enqueued after it.
  const Stream comm = rt_->comm_stream();
  ensure(u.gathered, {u.padded_numel}, DType::f32, MemCategory::gathered, *rt_);
  // Gathering in bf16/f16 moves half the bytes; the f32 compute copy holds the rounded values.
  if (dtype != DType::f32) ensure(u.gathered_lowp, {u.padded_numel}, dtype, MemCategory::gathered, *rt_);
  if (dtype == DType::f32) u.gathered_lowp = Tensor();  // a full-precision gather (for_each_gathered_unit)
  char* base = static_cast<char*>((dtype == DType::f32 ? u.gathered : u.gathered_lowp).raw());
  char* slot = base + r * u.shard_numel * dtype_bytes(dtype);
  const size_t count = static_cast<size_t>(u.shard_numel);
  if (dtype == DType::f32) {
    comm_waits_for_compute();
    rt_->copy_async(slot, mine, count * sizeof(float), copy_kind(*rt_, *shard_rt_), comm);
  } else {
    if (offloaded()) {  // the cast kernel reads device memory: bring the host shard over first
      u.staged_shard = Tensor::empty(*rt_, {u.shard_numel}, DType::f32, MemCategory::comm);
      rt_->copy_async(u.staged_shard.raw(), mine, count * sizeof(float), CopyKind::host_to_device,
                      rt_->compute_stream());
      mine = u.staged_shard.f32();
    }
    rt_->kernels().cast(slot, dtype, mine, DType::f32, static_cast<int64_t>(count));
    comm_waits_for_compute();
  }
  const int64_t bytes = u.padded_numel * static_cast<int64_t>(dtype_bytes(dtype));
  traffic_.all_gather.add(bytes, false);
  u.pending_gather = trace_->collective({"all_gather", CommGroup::shard, bytes, dtype, &u.spec.name}, comm,
                                        [&] { return mesh_.shard->all_gather(slot, base, count, dtype, comm); });
  u.state = UnitState::gathering;
}

void FsdpEngine::wait_for_unshard(Unit& u, const char* phase) {
  if (u.state == UnitState::sharded) unshard(u, phase);
  if (u.state == UnitState::gathering) {
    // The compute stream waits for the all_gather (an event on device backends); host backends
    // complete it here, within comm.timeout_s.
    {
      const auto span = trace_->scope(Track::compute, "wait_for_unshard", &u.spec.name);
      wait_on_naming(*u.pending_gather, rt_->compute_stream(), &u, u.gather_phase);
    }
    u.pending_gather.reset();
    u.staged_shard = Tensor();
    if (u.gathered_lowp.defined()) {  // gathered in param_dtype
      rt_->kernels().cast(u.gathered.f32(), DType::f32, u.gathered_lowp.raw(), u.gathered_lowp.dtype(), u.padded_numel);
      u.gathered_lowp = Tensor();
    }
    bind_data(u.layout, u.gathered.f32());
    u.state = UnitState::gathered;
  }
}

void FsdpEngine::reshard(Unit& u) {
  const auto span = trace_->scope(Track::host, "reshard", &u.spec.name);
  if (u.state == UnitState::gathering) wait_for_unshard(u, u.gather_phase);
  if (shard_is_the_unit()) return;  // nothing was gathered
  bind_data(u.layout, nullptr);
  u.gathered = Tensor();
  u.state = UnitState::sharded;
}

void FsdpEngine::prefetch(int unit_index, const char* phase) {
  if (unit_index < 0) return;
  Unit& u = *units_[unit_index];
  if (u.state != UnitState::sharded) return;
  // A guessed order (before the first backward has finished) can name a unit whose backward
  // already ran: gathering it again would only leave a copy that goes stale at the step.
  if (in_backward_ && u.backward_done) return;
  if (options_.limit_all_gathers) {
    // At most two non-root units' gathered buffers alive at once (the one computing + this one).
    int alive = 0;
    for (size_t i = 1; i < units_.size(); ++i) alive += units_[i]->state != UnitState::sharded;
    if (alive >= 2) return;
  }
  unshard(u, phase);
}

namespace {

// The entry after `unit` in `order` (-1: none, or unit not there).
int after(const std::vector<int>& order, int unit) {
  auto it = std::find(order.begin(), order.end(), unit);
  return it == order.end() || it + 1 == order.end() ? -1 : *(it + 1);
}

void record(std::vector<int>& order, int unit) {
  if (std::find(order.begin(), order.end(), unit) == order.end()) order.push_back(unit);
}

}  // namespace

int FsdpEngine::next_in_forward(const Unit& u) const { return after(forward_order_, index_of(u)); }

int FsdpEngine::next_in_backward(const Unit& u) const {
  const int i = index_of(u);
  if (backward_order_known_) return after(backward_order_, i);
  // Before the first backward has run: the reverse forward order, the root (entered first,
  // left last) followed by the unit forward reached last.
  if (i == 0) return forward_order_.size() > 1 ? forward_order_.back() : -1;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), i);
  return it == forward_order_.end() || it == forward_order_.begin() ? -1 : *(it - 1);
}

void FsdpEngine::pre_forward(Module& module) {
  Unit& u = unit_of(module);
  wait_for_unshard(u, "forward");
  trace_->begin(Track::compute, "forward", &u.spec.name);  // ends in post_forward
  if (in_backward_) return;  // a recompute: the unit's backward follows, which reduces and frees
  record(forward_order_, index_of(u));
  u.forward_uses += 1;
  if (options_.forward_prefetch) prefetch(next_in_forward(u), "forward prefetch");
}

void FsdpEngine::post_forward(Module& module) {
  trace_->end(Track::compute);
  Unit& u = unit_of(module);
  if (!in_backward_ && !keeps_params_after_forward(u)) reshard(u);
}

void FsdpEngine::pre_backward(Module& module) {
  Unit& u = unit_of(module);
  if (!in_backward_)
    for (auto& unit : units_) unit->backward_done = false;
  in_backward_ = true;
  if (u.backward_left == 0) {
    u.backward_left = std::max(1, u.forward_uses);
    u.forward_uses = 0;
    if (!backward_order_known_) record(backward_order_, index_of(u));
    wait_for_unshard(u, "backward");
    if (direct_grads()) {
      bind_grad(u.layout, grad_shard_for(u));  // NO_SHARD: accumulate in place
    } else if (!u.full_grad.defined()) {
      // Kept across micro-batches under no_sync; zeroed only when a step's first backward needs it.
      u.full_grad = Tensor::zeros(*rt_, {u.padded_numel}, DType::f32, MemCategory::grads);
      bind_grad(u.layout, u.full_grad.f32());
    } else {
      bind_grad(u.layout, u.full_grad.f32());
    }
  }
  if (options_.backward_prefetch == BackwardPrefetch::pre) prefetch(next_in_backward(u), "backward prefetch");
  trace_->begin(Track::compute, "backward", &u.spec.name);  // ends in post_backward
}

void FsdpEngine::post_backward(Module& module) {
  trace_->end(Track::compute);
  Unit& u = unit_of(module);
  if (--u.backward_left > 0) return;  // a module used twice: its other backward is still to come
  u.backward_done = true;
  if (options_.backward_prefetch == BackwardPrefetch::post) prefetch(next_in_backward(u), "backward prefetch");
  post_backward(u);
}

bool FsdpEngine::direct_grads() const {
  // Computing in bf16/f16 rounds each backward's parameter gradients (post_backward), so they
  // need a buffer of their own before they join the f32 shard.
  return mesh_.shard->size() == 1 && options_.reduce_dtype == DType::f32 && compute_dtype() == DType::f32 &&
         !offloaded();
}

void FsdpEngine::post_backward(Unit& u) {
  const auto span = trace_->scope(Track::host, "post_backward", &u.spec.name);
  bind_grad(u.layout, nullptr);
  // Computing in param_dtype, the unit's parameter gradients are param_dtype values, as PyTorch's
  // autograd leaves them in the low-precision parameters' .grad before FSDP casts them to
  // reduce_dtype. Under no_sync the rounding applies to the sum so far (gradients accumulating in
  // param_dtype).
  if (u.full_grad.defined() && compute_dtype() != DType::f32)
    rt_->kernels().round_to(u.full_grad.f32(), compute_dtype(), u.padded_numel);
  if (sync_grads_ && !direct_grads()) {
    // At most one reduction in flight besides this one: bounds the full gradients kept alive.
    while (pending_reductions_.size() > 1) {
      complete(pending_reductions_.front());
      pending_reductions_.erase(pending_reductions_.begin());
    }
    const Stream comm = rt_->comm_stream();
    const size_t count = static_cast<size_t>(u.shard_numel);
    const int64_t bytes = u.padded_numel * static_cast<int64_t>(dtype_bytes(options_.reduce_dtype));
    traffic_.reduce_scatter.add(bytes, false);
    const CollectiveInfo info{"reduce_scatter", CommGroup::shard, bytes, options_.reduce_dtype, &u.spec.name};
    // f32 on the device the shards are on: straight into the grad shard (overwritten: under
    // no_sync the full gradient accumulated). Else reduce in reduce_dtype (bf16/f16: half the
    // bytes) into a shard-size buffer, then add it into the f32 grad shard, completed at once: the
    // staging buffers' lifetimes are what the memory plan (plan.cpp) models.
    const bool in_place = options_.reduce_dtype == DType::f32 && !offloaded();
    Tensor in = std::move(u.full_grad), out;
    if (options_.reduce_dtype != DType::f32) {
      Tensor low = Tensor::empty(*rt_, {u.padded_numel}, options_.reduce_dtype, MemCategory::comm);
      rt_->kernels().cast(low.raw(), options_.reduce_dtype, in.raw(), DType::f32, u.padded_numel);
      in = std::move(low);
    }
    if (!in_place) out = Tensor::empty(*rt_, {u.shard_numel}, options_.reduce_dtype, MemCategory::comm);
    void* dst = in_place ? grad_shard_for(u) : out.raw();
    comm_waits_for_compute();  // the full gradient is compute's output
    auto issue = [&] {
      return mesh_.shard->reduce_scatter(in.raw(), dst, count, options_.reduce_dtype, ReduceOp::sum, comm);
    };
    PendingReduction p{trace_->collective(info, comm, issue), std::move(in), std::move(out), &u};
    if (in_place)
      pending_reductions_.push_back(std::move(p));
    else
      complete(p);
    u.full_grad = Tensor();
  }
  reshard(u);  // every strategy frees a unit's parameters once its backward is done
}

void FsdpEngine::complete(PendingReduction& p) {
  const Stream compute = rt_->compute_stream();
  {
    const auto span = trace_->scope(Track::compute, "wait_reduce_scatter", &p.unit->spec.name);  // never null
    wait_on_naming(*p.work, compute, p.unit, "post_backward");
  }
  if (!p.output.defined()) return;  // reduced straight into the grad shard
  const int64_t count = p.output.numel();
  float* dst = grad_shard_for(*p.unit);
  if (rt_->device() == Device::cpu) {
    if (!rt_->holds_values()) return;  // a plan's meta device: no values to add
    // Host: add the widened values in place (no f32 copy of the result).
    const auto* half = static_cast<const uint16_t*>(p.output.raw());
    const float* full = p.output.dtype() == DType::f32 ? p.output.f32() : nullptr;
    if (full) {
      for (int64_t i = 0; i < count; ++i) dst[i] += full[i];
    } else if (p.output.dtype() == DType::bf16) {
      for (int64_t i = 0; i < count; ++i) dst[i] += bf16_to_f32(half[i]);
    } else {
      for (int64_t i = 0; i < count; ++i) dst[i] += f16_to_f32(half[i]);
    }
    return;
  }
  // Device: widen on the compute stream; then add there, or (cpu_offload) copy to the host and
  // add on the host, where the optimizer steps.
  Tensor wide = p.output;
  if (p.output.dtype() != DType::f32) {
    wide = Tensor::empty(*rt_, {count}, DType::f32, MemCategory::comm);
    rt_->kernels().cast(wide.raw(), DType::f32, p.output.raw(), p.output.dtype(), count);
  }
  if (!offloaded()) {
    rt_->kernels().add_inplace(dst, wide.f32(), count);
    return;
  }
  Tensor host = to_host(*rt_, wide, MemCategory::comm, &mem_);
  shard_rt_->kernels().add_inplace(dst, host.f32(), count);
}

float* FsdpEngine::grad_shard_for(Unit& u) {
  if (!u.grad_shard.defined())
    u.grad_shard = Tensor::zeros(*shard_rt_, {u.shard_numel}, DType::f32, MemCategory::grads);
  return u.grad_shard.f32();
}

std::vector<GradSlice> FsdpEngine::grad_shards() const {
  std::vector<GradSlice> slices;
  for (const auto& u : units_) slices.push_back({u->shard_offset, grad_shard(*u)});
  return slices;
}

void FsdpEngine::begin_step() {
  for (auto& u : units_) u->grad_shard = Tensor();
  for (CollectiveCount* c : {&traffic_.all_gather, &traffic_.reduce_scatter, &traffic_.all_reduce})
    *c = CollectiveCount{0, 0, 0, c->group_size};
}

void FsdpEngine::finish_backward() {
  in_backward_ = false;
  // Every unit's backward resharded it; anything still gathered (a prefetch nobody used) holds
  // the values before this step's update: drop it.
  for (auto& u : units_)
    if (u->state != UnitState::sharded) reshard(*u);
  if (!backward_order_.empty()) backward_order_known_ = true;
  for (auto& p : pending_reductions_) complete(p);
  pending_reductions_.clear();
  // A unit no backward reached (its module unused this step) steps on zeros, as before the
  // shards were freed between steps.
  if (sync_grads_)
    for (auto& u : units_) grad_shard_for(*u);
  if (sync_grads_ && mesh_.replicate->size() > 1) {
    // HYBRID and NO_SHARD: replicas of the same shard sum their gradients, one all_reduce per
    // unit's shard (each its own allocation), all issued before the first wait, ordered on the
    // stream that owns the shards.
    const Stream s = shard_rt_->compute_stream();
    std::vector<std::unique_ptr<Work>> works;
    for (auto& u : units_) {
      const int64_t bytes = u->shard_numel * static_cast<int64_t>(sizeof(float));
      traffic_.all_reduce.add(bytes, true);
      void* g = u->grad_shard.raw();
      works.push_back(
          trace_->collective({"all_reduce", CommGroup::replicate, bytes, DType::f32, &u->spec.name}, s, [&] {
            return mesh_.replicate->all_reduce(g, g, static_cast<size_t>(u->shard_numel), DType::f32, ReduceOp::sum, s);
          }));
    }
    const auto span = trace_->scope(Track::compute, "wait_all_reduce");
    for (size_t i = 0; i < works.size(); ++i) wait_on_naming(*works[i], s, units_[i].get(), "replicate all_reduce");
  }
}

void FsdpEngine::for_each_gathered_unit(const std::function<void(const Unit&)>& fn) {
  // The f32 values of the shards, whatever param_dtype (as PyTorch's full state dict under
  // MixedPrecision): a unit still gathered in param_dtype is freed and gathered again in f32.
  for (auto& u : units_) {
    if (u->state != UnitState::sharded) reshard(*u);
    full_precision_gather_ = true;
    try {
      wait_for_unshard(*u, "full weights");
      fn(*u);
      reshard(*u);
    } catch (...) {
      full_precision_gather_ = false;
      throw;
    }
    full_precision_gather_ = false;
  }
}

void FsdpEngine::end_forward_only() {
  for (auto& u : units_) {
    u->forward_uses = 0;
    if (u->state != UnitState::sharded) reshard(*u);
  }
}

void FsdpEngine::unshard_all() {
  for (auto& u : units_) unshard(*u, "generation");
  for (auto& u : units_) wait_for_unshard(*u, "generation");
}

void FsdpEngine::reshard_all() { end_forward_only(); }

// The next three return or use host values: the kernels wait for the shard stream there.
bool FsdpEngine::grads_finite() {
  bool finite = true;
  for (auto& u : units_) finite = finite && shard_rt_->kernels().all_finite(grad_shard_for(*u), u->shard_numel);
  int32_t bad = finite ? 0 : 1;
  const CollectiveInfo info{"all_reduce", CommGroup::world, sizeof bad, DType::i32, nullptr, true};
  trace_->collective(info, {}, [&] { return world_.all_reduce(&bad, &bad, 1, DType::i32, ReduceOp::max); })->wait();
  return bad == 0;
}

void FsdpEngine::scale_grads(float factor) {
  for (auto& u : units_) shard_rt_->kernels().scale(grad_shard_for(*u), factor, u->shard_numel);
}

double FsdpEngine::clip_grad_norm(double max_norm) {
  const auto span = trace_->scope(Track::compute, "clip_grad_norm");
  const CollectiveInfo info{"all_reduce", CommGroup::shard, sizeof(double), DType::f64, nullptr, true};
  // f64 partial sums per unit's shard, added in unit order.
  double local = 0.0;
  for (auto& u : units_) local += shard_rt_->kernels().sum_squares(grad_shard_for(*u), u->shard_numel);
  double total = local;
  // Shards of one replica partition the gradient: their squares add up over the shard group.
  if (rt_->device() == Device::cpu) {
    trace_->collective(info, {}, [&] { return mesh_.shard->all_reduce(&local, &total, 1, DType::f64, ReduceOp::sum); })
        ->wait();
  } else {  // the shard group's communicator may move device memory only (NCCL)
    Tensor host = Tensor::empty({1}, DType::f64, MemCategory::comm, &mem_);
    *static_cast<double*>(host.raw()) = local;
    Tensor dev = to_device(*rt_, host, MemCategory::comm);
    const Stream s = rt_->compute_stream();
    trace_
        ->collective(info, s,
                     [&] { return mesh_.shard->all_reduce(dev.raw(), dev.raw(), 1, DType::f64, ReduceOp::sum, s); })
        ->wait_on(s);
    total = *static_cast<const double*>(to_host(*rt_, dev).raw());
  }
  double norm = std::sqrt(total);
  if (max_norm > 0.0) {
    float coef = static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
    for (auto& u : units_) shard_rt_->kernels().scale(grad_shard_for(*u), coef, u->shard_numel);
  }
  return norm;
}

}  // namespace fsdp
