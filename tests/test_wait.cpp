#define BOOST_TEST_MODULE wait
#include <boost/test/unit_test.hpp>
// Waits and their timeouts, without MPI: the collective layer's one poll loop
// (comm.h poll_until_deadline) and the FSDP engine's timeout messages, which name the unit and
// phase a collective was for (a fake shard group whose collectives hang after the first few).
#include <chrono>
#include <ctime>
#include <memory>
#include <string>

#include "comm/comm.h"
#include "comm/local.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "models/t5/t5.h"
#include "models/transformer/transformer.h"
#include "nn/loss.h"
#include "tensor/error.h"
#include "tensor/memory.h"

namespace {

using fsdp::CollectiveDesc;
using fsdp::CommTimeout;
using fsdp::DType;
using fsdp::PollResult;
using Clock = std::chrono::steady_clock;

constexpr double kTimeout_s = 0.2;
const std::string kTail =
    " did not complete within comm.timeout_s = 0.2 s (a rank may have failed or skipped this collective)";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A collective no peer ever joins: its wait ends in CommTimeout after the comm's timeout.
class HungWork : public fsdp::PollingWork {
 public:
  using PollingWork::PollingWork;
  bool test() override { return false; }
};

// Rank 0 of a `size`-rank group whose first `gathers_ok` all_gathers complete at once (the output
// is left as it was: these tests look at messages, not values) and whose other collectives hang.
class HangingComm : public fsdp::Communicator {
 public:
  HangingComm(int size, int gathers_ok) : Communicator({kTimeout_s}), size_(size), gathers_ok_(gathers_ok) {}
  std::string_view backend() const override { return "fake"; }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::unique_ptr<Communicator> split(int, int) const override { throw fsdp::Error("fake: no split"); }
  std::unique_ptr<fsdp::Work> all_gather(const void*, void*, size_t count, DType dtype, fsdp::Stream) override {
    if (gathers_ok_-- > 0) {
      next_seq();
      return std::make_unique<fsdp::DoneWork>();
    }
    return hung("all_gather", count, dtype);
  }
  std::unique_ptr<fsdp::Work> reduce_scatter(const void*, void*, size_t count, DType dtype, fsdp::ReduceOp,
                                             fsdp::Stream) override {
    return hung("reduce_scatter", count, dtype);
  }
  std::unique_ptr<fsdp::Work> all_reduce(const void*, void*, size_t count, DType dtype, fsdp::ReduceOp,
                                         fsdp::Stream) override {
    return hung("all_reduce", count, dtype);
  }
  std::unique_ptr<fsdp::Work> broadcast(void*, size_t count, DType dtype, int, fsdp::Stream) override {
    return hung("broadcast", count, dtype);
  }
  void barrier() override { hung("barrier", 0, DType::u8)->wait(); }

 private:
  std::unique_ptr<fsdp::Work> hung(const char* collective, size_t count, DType dtype) {
    return std::make_unique<HungWork>(CollectiveDesc{"fake", collective, count, dtype, next_seq()}, kTimeout_s);
  }
  int size_;
  int gathers_ok_;
};

// A two-block transformer (units: root = embeddings + ln_f + head, blocks.0, blocks.1) under an
// engine whose shard group is `shard` (replicate group: `replicate`, or one local rank).
struct Rig {
  explicit Rig(std::unique_ptr<fsdp::Communicator> shard, fsdp::FsdpOptions options = {},
               std::unique_ptr<fsdp::Communicator> replicate = nullptr)
      : model(fsdp::make_transformer(8, 8, 2, 2, 16, 4)), world(fsdp::make_local_communicator({kTimeout_s})) {
    options.wrap_policy = fsdp::WrapPolicy::transformer_layer;
    fsdp::ProcessMesh mesh{std::move(shard), replicate ? std::move(replicate) : fsdp::make_local_communicator()};
    engine = std::make_unique<fsdp::FsdpEngine>(*model, *world, std::move(mesh), options, mem);
  }
  fsdp::Layer& layer(const std::string& name) {
    for (fsdp::Layer* l : model->layers())
      if (l->name() == name) return *l;
    throw fsdp::Error("no layer " + name);
  }
  // The hooks one forward calls: the root, then each block (gathered, then freed: FULL_SHARD).
  void run_forward() {
    engine->pre_forward(*model);
    for (const char* block : {"blocks.0", "blocks.1"}) {
      engine->pre_forward(layer(block));
      engine->post_forward(layer(block));
    }
    engine->post_forward(*model);
  }
  std::unique_ptr<fsdp::Model> model;
  std::unique_ptr<fsdp::Communicator> world;
  fsdp::MemoryTracker mem;
  std::unique_ptr<fsdp::FsdpEngine> engine;
};

// The message of the CommTimeout `fn` throws ("" when it returns or throws something else).
template <class F>
std::string timeout_message(F&& fn) {
  try {
    fn();
  } catch (const CommTimeout& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a CommTimeout: ") + e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(poll_until_deadline)

BOOST_AUTO_TEST_CASE(returns_once_the_poll_says_done) {
  int polls = 0;
  fsdp::poll_until_deadline(CollectiveDesc{"fake", "all_gather", 80, DType::f32, 7}, kTimeout_s, {}, [&] {
    return PollResult{++polls == 1000, false};
  });
  BOOST_TEST(polls == 1000);
}

BOOST_AUTO_TEST_CASE(times_out_with_the_collective_named) {
  const auto t0 = Clock::now();
  const std::string message = timeout_message([] {
    fsdp::poll_until_deadline(CollectiveDesc{"fake", "all_gather", 80, DType::f32, 7}, kTimeout_s, {},
                              [] { return PollResult{}; });
  });
  const double waited_s = seconds_since(t0);
  BOOST_TEST(message == "fake all_gather #7 (count 80, f32)" + kTail);
  BOOST_TEST(waited_s >= kTimeout_s);
  BOOST_TEST(waited_s < kTimeout_s + 1.0);
}

// A collective that keeps reporting progress is still bounded by comm.timeout_s: progress may
// come from other collectives of the family (UCX, MPI's shared-memory pipeline) while this one
// hangs.
BOOST_AUTO_TEST_CASE(moving_polls_still_time_out) {
  const std::string message = timeout_message([] {
    fsdp::poll_until_deadline(CollectiveDesc{"fake", "all_reduce", 5, DType::bf16, 2}, kTimeout_s, {}, [] {
      return PollResult{false, true};
    });
  });
  BOOST_TEST(message == "fake all_reduce #2 (count 5, bf16)" + kTail);
}

// Past the backoff's yield phase an idle wait sleeps: waiting for a peer still computing must
// leave the core to it (oversubscribed nodes).
BOOST_AUTO_TEST_CASE(long_idle_waits_sleep) {
  const std::clock_t cpu0 = std::clock();
  const auto t0 = Clock::now();
  const double timeout_s = 0.5;
  timeout_message([&] {
    fsdp::poll_until_deadline(CollectiveDesc{"fake", "barrier", 0, DType::u8, 0}, timeout_s,
                              {.spin_polls = 64, .yield_polls = 256}, [] { return PollResult{}; });
  });
  const double cpu_s = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC, wall_s = seconds_since(t0);
  BOOST_TEST_MESSAGE("idle wait of " << wall_s << " s used " << cpu_s << " s of CPU");
  BOOST_TEST(cpu_s < 0.5 * wall_s);
}

BOOST_AUTO_TEST_CASE(for_purpose_names_what_the_collective_was_for) {
  const CommTimeout e(CollectiveDesc{"mpi", "all_gather", 80, DType::f32, 84}, 20);
  BOOST_TEST(std::string(e.for_purpose("of unit blocks.3 (backward prefetch)").what()) ==
             "mpi all_gather of unit blocks.3 (backward prefetch) #84 (count 80, f32) did not complete within "
             "comm.timeout_s = 20 s (a rank may have failed or skipped this collective)");
  // A timeout worded by its thrower (a device event) keeps its words, the purpose in front.
  const CommTimeout device("cuda event: not done after 20 s");
  BOOST_TEST(std::string(device.for_purpose("of unit root (forward)").what()) ==
             "of unit root (forward): cuda event: not done after 20 s");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(engine_timeouts)

BOOST_AUTO_TEST_CASE(forward_gather) {
  Rig rig(std::make_unique<HangingComm>(2, 0));
  const std::string message = timeout_message([&] { rig.engine->pre_forward(*rig.model); });
  BOOST_CHECK_MESSAGE(message.rfind("fake all_gather of unit root (forward) #0 (count ", 0) == 0, message);
  BOOST_CHECK_MESSAGE(message.find(kTail) != std::string::npos, message);
}

BOOST_AUTO_TEST_CASE(forward_prefetch) {
  fsdp::FsdpOptions options;
  options.forward_prefetch = true;
  // Prefetch follows the order the first forward recorded: the second forward prefetches.
  Rig rig(std::make_unique<HangingComm>(2, 4), options);  // the first forward's and the root's gathers complete
  rig.run_forward();
  rig.engine->end_forward_only();
  rig.engine->pre_forward(*rig.model);  // #3, prefetches blocks.0 (#4)
  const std::string message = timeout_message([&] { rig.engine->pre_forward(rig.layer("blocks.0")); });
  BOOST_CHECK_MESSAGE(message.rfind("fake all_gather of unit blocks.0 (forward prefetch) #4 (count ", 0) == 0, message);
}

BOOST_AUTO_TEST_CASE(backward_gather) {
  fsdp::FsdpOptions options;
  options.backward_prefetch = fsdp::BackwardPrefetch::none;
  Rig rig(std::make_unique<HangingComm>(2, 1), options);
  rig.engine->pre_backward(*rig.model);  // the root: gathered
  const std::string message = timeout_message([&] { rig.engine->pre_backward(rig.layer("blocks.1")); });
  BOOST_CHECK_MESSAGE(message.rfind("fake all_gather of unit blocks.1 (backward) #1 (count ", 0) == 0, message);
}

BOOST_AUTO_TEST_CASE(backward_prefetch) {
  fsdp::FsdpOptions options;
  options.backward_prefetch = fsdp::BackwardPrefetch::pre;
  Rig rig(std::make_unique<HangingComm>(2, 3), options);  // the forward's gathers complete
  rig.run_forward();
  // The root (kept since forward); before any backward has run, the reverse forward order
  // names blocks.1 next: prefetched (#3).
  rig.engine->pre_backward(*rig.model);
  const std::string message = timeout_message([&] { rig.engine->pre_backward(rig.layer("blocks.1")); });
  BOOST_CHECK_MESSAGE(message.rfind("fake all_gather of unit blocks.1 (backward prefetch) #3 (count ", 0) == 0,
                      message);
}

BOOST_AUTO_TEST_CASE(post_backward_reduce_scatter) {
  fsdp::FsdpOptions options;
  options.backward_prefetch = fsdp::BackwardPrefetch::none;
  Rig rig(std::make_unique<HangingComm>(2, 100), options);
  rig.engine->begin_step();
  rig.engine->pre_backward(rig.layer("blocks.1"));   // gather #0
  rig.engine->post_backward(rig.layer("blocks.1"));  // reduce_scatter #1, waited for in finish_backward
  const std::string message = timeout_message([&] { rig.engine->finish_backward(); });
  BOOST_CHECK_MESSAGE(message.rfind("fake reduce_scatter of unit blocks.1 (post_backward) #1 (count ", 0) == 0,
                      message);
  BOOST_CHECK_MESSAGE(message.find(kTail) != std::string::npos, message);
}

BOOST_AUTO_TEST_CASE(replicate_all_reduce) {
  Rig rig(fsdp::make_local_communicator({kTimeout_s}), {}, std::make_unique<HangingComm>(2, 0));
  rig.engine->begin_step();
  const std::string message = timeout_message([&] { rig.engine->finish_backward(); });
  BOOST_CHECK_MESSAGE(message.rfind("fake all_reduce of unit root (replicate all_reduce) #0 (count ", 0) == 0, message);
}

BOOST_AUTO_TEST_SUITE_END()

// The engine follows the model's calls: prefetch, and a module called more than once.
// Prefetch before the first backward has finished follows a guessed order. In T5's attention
// forward runs q, k, v and backward runs o, q, k, v, so the guess (the reverse forward order)
// names units whose backward already ran: gathering one of those would leave a copy that the
// optimizer step makes stale, and the next forward (or a save) would read it. After
// finish_backward no unit may still hold gathered parameters.
BOOST_AUTO_TEST_SUITE(engine_order)

BOOST_AUTO_TEST_CASE(no_unit_stays_gathered_after_backward) {
  fsdp::T5Config c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.d_kv = 4;
  c.num_heads = 2;
  c.d_ff = 8;
  c.num_layers = c.num_decoder_layers = 1;
  c.relative_attention_num_buckets = 4;
  c.relative_attention_max_distance = 8;
  fsdp::MemoryTracker mem;  // first: it outlives the model, whose tensors it tracks
  auto model = fsdp::make_t5(c);
  auto world = fsdp::make_local_communicator({kTimeout_s});
  fsdp::FsdpOptions options;
  options.wrap_policy = fsdp::WrapPolicy::size_based;
  options.min_num_params = 48;  // every projection its own unit, nothing above them
  // All gathers complete at once (moving nothing); no reduction is issued (sync_grads off).
  fsdp::ProcessMesh mesh{std::make_unique<HangingComm>(2, 1 << 20), fsdp::make_local_communicator()};
  fsdp::FsdpEngine engine(*model, *world, std::move(mesh), options, mem);
  BOOST_REQUIRE(engine.units().size() > 8);
  fsdp::Tensor ids = fsdp::Tensor::zeros({2, 3}, DType::i32), labels = fsdp::Tensor::zeros({2, 3}, DType::i32);
  for (int i = 0; i < 6; ++i) ids.i32()[i] = labels.i32()[i] = 3 + i;
  fsdp::RunCtx ctx;
  ctx.mem = &mem;
  ctx.hooks = &engine;
  ctx.dropout = false;
  ctx.loss_normalizer = 6;
  for (int step = 0; step < 2; ++step) {  // the guessed order, then the recorded one
    engine.begin_step();
    engine.set_sync_grads(false);
    model->forward(ctx, ids, labels);
    model->backward(ctx);
    engine.finish_backward();
    for (const auto& u : engine.units())
      BOOST_CHECK_MESSAGE(u->state == fsdp::UnitState::sharded,
                          "step " << step << ": unit " << u->spec.name << " still gathered after backward");
  }
}

// Generation gathers every unit once for the whole decoding pass (unshard_all), not once per
// generated token: ZeRO-3's per-token gathers are what make its generation 10x slower.
BOOST_AUTO_TEST_CASE(generation_gathers_each_unit_once_per_pass) {
  fsdp::T5Config c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.d_kv = 4;
  c.num_heads = 2;
  c.d_ff = 8;
  c.num_layers = c.num_decoder_layers = 2;
  c.relative_attention_num_buckets = 4;
  c.relative_attention_max_distance = 8;
  fsdp::MemoryTracker mem;  // first: it outlives the model, whose tensors it tracks
  auto model = fsdp::make_t5(c);
  auto world = fsdp::make_local_communicator({kTimeout_s});
  fsdp::FsdpOptions options;
  options.wrap_policy = fsdp::WrapPolicy::size_based;
  options.min_num_params = 48;
  fsdp::ProcessMesh mesh{std::make_unique<HangingComm>(2, 1 << 20), fsdp::make_local_communicator()};
  fsdp::FsdpEngine engine(*model, *world, std::move(mesh), options, mem);
  engine.init_shards(1);
  BOOST_REQUIRE(engine.units().size() > 8);
  fsdp::Tensor ids = fsdp::Tensor::zeros({3, 5}, DType::i32);
  for (int i = 0; i < 15; ++i) ids.i32()[i] = 2 + i % 14;
  fsdp::RunCtx ctx;
  ctx.mem = &mem;
  ctx.training = false;
  fsdp::GenerateOptions o;
  o.max_new_tokens = 7;
  for (int64_t beams : {1, 3}) {
    o.num_beams = beams;
    engine.begin_step();  // counts from zero
    engine.unshard_all();
    const auto out = model->generate(ctx, ids, o);
    engine.reshard_all();
    BOOST_CHECK_EQUAL(engine.step_traffic().all_gather.calls, static_cast<int64_t>(engine.units().size()));
    BOOST_REQUIRE_EQUAL(out.size(), 3u);
    for (const auto& seq : out) {
      BOOST_CHECK(!seq.empty() && seq.size() <= 7u);
      for (int32_t t : seq) BOOST_CHECK(t >= 0 && t < 16);
    }
    for (const auto& u : engine.units())
      BOOST_CHECK_MESSAGE(u->state == fsdp::UnitState::sharded, "unit " << u->spec.name << " still gathered");
  }
}

namespace {

// y = w * x with a scalar w, callable several times in one pass: each call pushes its input,
// each backward pops one (llm.c-style layers keep one call's buffers; this one keeps a stack).
class Scale : public fsdp::Layer {
 public:
  explicit Scale(const std::string& name)
      : Layer(name, "Scale"), w(add_param("w", {1}, {fsdp::ParamInit::Kind::constant, 3.0f, 0.0f})) {}
  const fsdp::Tensor& do_forward(fsdp::RunCtx&, const fsdp::Tensor& x) override {
    inputs_.push_back(x);
    outputs_.push_back(fsdp::Tensor::empty(x.shape(), DType::f32));
    for (int64_t i = 0; i < x.numel(); ++i) outputs_.back().f32()[i] = w.data[0] * x.f32()[i];
    return outputs_.back();
  }
  const fsdp::Tensor& do_backward(fsdp::RunCtx&, const fsdp::Tensor& dy) override {
    const fsdp::Tensor x = inputs_.back();
    inputs_.pop_back();
    dx_ = fsdp::Tensor::empty(x.shape(), DType::f32);
    for (int64_t i = 0; i < x.numel(); ++i) {
      w.grad[0] += dy.f32()[i] * x.f32()[i];
      dx_.f32()[i] = dy.f32()[i] * w.data[0];
    }
    return dx_;
  }
  void release_activations() override {}
  fsdp::Param& w;

 private:
  std::vector<fsdp::Tensor> inputs_, outputs_;
  fsdp::Tensor dx_;
};

// loss = sum of the outputs.
class SumLoss : public fsdp::Loss {
 public:
  double forward(fsdp::RunCtx&, const fsdp::Tensor& y, const fsdp::Tensor&) override {
    shape_ = y.shape();
    last_sum_ = 0;
    for (int64_t i = 0; i < y.numel(); ++i) last_sum_ += y.f32()[i];
    return last_sum_;
  }
  const fsdp::Tensor& backward(fsdp::RunCtx&) override {
    grad_ = fsdp::Tensor::empty(shape_, DType::f32);
    for (int64_t i = 0; i < grad_.numel(); ++i) grad_.f32()[i] = 1.0f;
    return grad_;
  }

 private:
  fsdp::Shape shape_;
  fsdp::Tensor grad_;
};

// y = scale(scale(x)): one module, called twice.
class Twice : public fsdp::Model {
 public:
  Twice() : Model("Twice", std::make_unique<SumLoss>()), scale(add_child<Scale>("scale")) {}
  Scale& scale;

 protected:
  fsdp::Tensor run_forward(fsdp::RunCtx& ctx, const fsdp::Tensor& x, const fsdp::Tensor&) override {
    const fsdp::Tensor h = scale.forward(ctx, x);
    return scale.forward(ctx, h);
  }
  fsdp::Tensor run_backward(fsdp::RunCtx& ctx, const fsdp::Tensor& dy) override {
    const fsdp::Tensor dh = scale.backward(ctx, dy);
    return scale.backward(ctx, dh);
  }
};

}  // namespace

// A module used twice in forward is a unit gathered for both uses; its gradient is the sum of
// both uses' (w = 3, x = (1, 2): y = 9x, dL/dw = 2 w sum(x) = 18) and it is reduced once, after
// its last backward. bf16 reductions: the engine's full-gradient path (18 and 9 are exact).
BOOST_AUTO_TEST_CASE(a_module_used_twice_reduces_once_with_both_gradients) {
  fsdp::MemoryTracker mem;  // first: it outlives the model, whose tensors it tracks
  Twice model;
  auto world = fsdp::make_local_communicator({kTimeout_s});
  fsdp::FsdpOptions options;
  options.wrap_policy = fsdp::WrapPolicy::manual;
  options.wrap_modules = {"scale"};
  options.reduce_dtype = DType::bf16;
  fsdp::FsdpEngine engine(model, *world, {fsdp::make_local_communicator(), fsdp::make_local_communicator()}, options,
                          mem);
  BOOST_REQUIRE(engine.units().size() == 2);
  engine.init_shards(1);
  fsdp::Tensor x = fsdp::Tensor::empty({2, 1}, DType::f32);
  x.f32()[0] = 1.0f;
  x.f32()[1] = 2.0f;
  fsdp::RunCtx ctx;
  ctx.mem = &mem;
  ctx.hooks = &engine;
  engine.begin_step();
  BOOST_TEST(model.forward(ctx, x, fsdp::Tensor()) == 27.0);
  model.backward(ctx);
  engine.finish_backward();
  const fsdp::Unit& unit = *engine.units()[1];
  BOOST_TEST(fsdp::FsdpEngine::grad_shard(unit)[0] == 18.0f);
  BOOST_TEST(engine.step_traffic().reduce_scatter.calls == 2);  // the root and `scale`, once each
  // The grad shards live until the next step begins, then are freed (zero_grad(set_to_none=True)):
  // its forward holds no gradients.
  const size_t shard_bytes = static_cast<size_t>(engine.units()[0]->shard_numel + unit.shard_numel) * sizeof(float);
  BOOST_TEST(mem.current_bytes(fsdp::MemCategory::grads) == shard_bytes);
  engine.begin_step();
  BOOST_TEST(mem.current_bytes(fsdp::MemCategory::grads) == 0u);
  BOOST_TEST(fsdp::FsdpEngine::grad_shard(unit).empty());
}

BOOST_AUTO_TEST_SUITE_END()
