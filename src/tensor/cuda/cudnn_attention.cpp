// FusedAttention through cuDNN's scaled-dot-product attention (fused_attention.h): a flash
// attention forward (O and each row's log-sum-exp) and backward (dQ, dK, dV from O, dO and the
// statistics), bf16 operands and outputs, f32 softmax and accumulation, causal (top-left
// diagonal), on the packed (B, T, 3C) projections in place: q, k and v are strided views of the
// same rows, so nothing is copied into a (B, H, T, hd) layout.
//
// The frontend is built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (meson): cuDNN is dlopen()ed
// on first use (libcudnn.so.9 from LD_LIBRARY_PATH: the CUDA toolkit's, or the nvidia-cudnn wheel
// beside PyTorch, which run-gpu-checks.sh puts there), and so is the CUDA runtime the frontend
// calls (libcudart.so.12/.13; our own is linked statically in the bundle: both drive the same
// primary context). The frontend reads the library handle from its one global,
// cudnn_frontend::cudnn_dlhandle, defined here and set once.
//
// The backward asks for cuDNN's deterministic algorithm (dQ summed in a fixed order); where cuDNN
// has none for the shape, it takes the default one and says so once on stderr.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include <cudnn_frontend.h>

#include "tensor/cuda/fused_attention.h"
#include "tensor/error.h"

namespace cudnn_frontend {
// The frontend declares this global and reads it for every cuDNN call (cudnn_frontend_shim.h);
// load_cudnn() sets it once.
void* cudnn_dlhandle = nullptr;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)
}  // namespace cudnn_frontend

namespace fsdp::cuda {

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the graphs' variant packs.
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// dlopen()s cuDNN once per process. Returns "" or why it cannot be used.
std::string load_cudnn() {
  static std::once_flag once;
  static std::string why;
  std::call_once(once, [] {
    dlerror();
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      why = std::string("cuDNN 9 (libcudnn.so.9) could not be loaded: ") + (e ? e : "not found") +
            "; fused attention needs it: put its lib folder (the CUDA toolkit's, or "
            "site-packages/nvidia/cudnn/lib beside PyTorch) on LD_LIBRARY_PATH";
      return;
    }
    fe::cudnn_dlhandle = h;
    try {
      const size_t version = fe::detail::get_backend_version();
      if (version < 90000) why = "cuDNN " + std::to_string(version) + " is older than 9.0: fused attention needs 9";
    } catch (const std::exception& e) {
      why = std::string("cuDNN loaded but unusable: ") + e.what();
    }
  });
  return why;
}

std::string shape_text(const FusedAttentionShape& s) {
  return "B " + std::to_string(s.B) + ", T " + std::to_string(s.T) + ", H " + std::to_string(s.H) + ", head dim " +
         std::to_string(s.hd);
}

void check(fe::error_object e, const char* what, const FusedAttentionShape& s) {
  if (e.is_good()) return;
  throw Error(std::string("cuda: cuDNN fused attention, ") + what + " (" + shape_text(s) + "): " + e.get_message());
}

// (B, H, T, hd) view of rows of `row` elements, head h at column h * hd.
std::shared_ptr<fe::graph::Tensor_attributes> bhtd(fe::graph::Graph& g, const char* name, int64_t uid,
                                                   const FusedAttentionShape& s, int64_t row) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({s.B, s.H, s.T, s.hd})
                      .set_stride({s.T * row, s.hd, row, 1}));
}

void set_bhtd(fe::graph::Tensor_attributes& t, int64_t uid, const FusedAttentionShape& s, int64_t row) {
  t.set_output(true).set_uid(uid).set_dim({s.B, s.H, s.T, s.hd}).set_stride({s.T * row, s.hd, row, 1});
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

}  // namespace

struct FusedAttention::Impl {
  struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace_bytes = 0;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, uint32_t, bool>;  // B, T, H, hd, scale bits, backward

  explicit Impl(cudaStream_t s) : stream(s) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;
  ~Impl() {
    if (!handle) return;
    try {
      fe::detail::destroy_handle(handle);
    } catch (...) {  // the shim throws when a symbol is missing: nothing to release then
    }
  }

  std::string usable() {
    std::string why = load_cudnn();
    if (!why.empty() || handle) return why;
    try {
      if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) {
        handle = nullptr;
        return "cudnnCreate failed: " + fe::detail::get_last_error_string_();
      }
      if (fe::detail::set_stream(handle, stream) != CUDNN_STATUS_SUCCESS)
        return "cudnnSetStream failed: " + fe::detail::get_last_error_string_();
    } catch (const std::exception& e) {
      return std::string("cuDNN: ") + e.what();
    }
    return "";
  }

  Plan& plan(const FusedAttentionShape& s, bool backward) {
    if (std::string why = usable(); !why.empty()) throw Error(why);
    if (s.hd % 8 != 0 || s.hd > 256)
      throw Error("cuda: cuDNN fused attention needs a head dim that is a multiple of 8, at most 256 (" +
                  shape_text(s) + ")");
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
    const Key key{s.B, s.T, s.H, s.hd, scale_bits, backward};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    try {
      std::string no_deterministic;
      p.graph = backward ? build_backward(s, true, &no_deterministic) : build_forward(s);
      if (!p.graph) {  // no deterministic backward for this shape on this cuDNN: the default one
        std::fprintf(stderr,
                     "fsdp: cuDNN %zu has no deterministic attention backward for %s here (%s): dQ is summed in "
                     "a run-dependent order (last bits may differ between runs)\n",
                     fe::detail::get_backend_version(), shape_text(s).c_str(), no_deterministic.c_str());
        p.graph = build_backward(s, false, nullptr);
      }
      check(p.graph->get_workspace_size(p.workspace_bytes), "workspace size", s);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(std::string("cuda: cuDNN fused attention (") + shape_text(s) + "): " + e.what());
    }
    return plans.emplace(key, std::move(p)).first->second;
  }

  std::shared_ptr<fe::graph::Graph> build_forward(const FusedAttentionShape& s) {
    const int64_t C = s.H * s.hd;
    auto g = new_graph();
    auto q = bhtd(*g, "q", kQ, s, 3 * C), k = bhtd(*g, "k", kK, s, 3 * C), v = bhtd(*g, "v", kV, s, 3 * C);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("causal_attention")
                       .set_generate_stats(true)
                       .set_attn_scale(s.scale)
                       .set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, k, v, options);
    set_bhtd(*o, kO, s, C);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.B, s.H, s.T, 1})
        .set_stride({s.H * s.T, s.T, 1, 1});
    check(g->build(handle, {fe::HeurMode_t::A}), "forward graph", s);
    return g;
  }

  // nullptr when `deterministic` is asked for and cuDNN has no such plan (its reason in *why_not);
  // any other failure throws.
  std::shared_ptr<fe::graph::Graph> build_backward(const FusedAttentionShape& s, bool deterministic,
                                                   std::string* why_not) {
    const int64_t C = s.H * s.hd;
    auto g = new_graph();
    auto q = bhtd(*g, "q", kQ, s, 3 * C), k = bhtd(*g, "k", kK, s, 3 * C), v = bhtd(*g, "v", kV, s, 3 * C);
    auto o = bhtd(*g, "o", kO, s, C), dO = bhtd(*g, "dO", kDO, s, C);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({s.B, s.H, s.T, 1})
                               .set_stride({s.H * s.T, s.T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("causal_attention_backward")
                       .set_attn_scale(s.scale)
                       .set_causal_mask(true)
                       .set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, stats, options);
    set_bhtd(*dq, kDQ, s, 3 * C);
    set_bhtd(*dk, kDK, s, 3 * C);
    set_bhtd(*dv, kDV, s, 3 * C);
    fe::error_object e = g->build(handle, {fe::HeurMode_t::A});
    const bool unsupported = e.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED ||
                             e.get_code() == fe::error_code_t::HEURISTIC_QUERY_FAILED ||
                             e.get_code() == fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED;
    if (deterministic && unsupported && why_not) {
      *why_not = e.get_message();
      return nullptr;
    }
    check(e, "backward graph", s);
    return g;
  }

  void run(const Plan& p, std::unordered_map<int64_t, void*>& pack, void* workspace, const char* what,
           const FusedAttentionShape& s) {
    check(p.graph->execute(handle, pack, workspace), what, s);
  }

  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Plan> plans;
};

FusedAttention::FusedAttention(cudaStream_t stream) : impl_(std::make_unique<Impl>(stream)) {}
FusedAttention::~FusedAttention() = default;

std::string FusedAttention::unavailable() { return impl_->usable(); }

int64_t FusedAttention::workspace_bytes(const FusedAttentionShape& s, bool backward) {
  return impl_->plan(s, backward).workspace_bytes;
}

void FusedAttention::forward(const FusedAttentionShape& s, const uint16_t* qkv, uint16_t* o, float* stats,
                             void* workspace) {
  const Impl::Plan& p = impl_->plan(s, false);
  const int64_t C = s.H * s.hd;
  auto* base = const_cast<uint16_t*>(qkv);  // cuDNN's variant pack is void*; q, k, v are read only
  std::unordered_map<int64_t, void*> pack{{kQ, base}, {kK, base + C}, {kV, base + 2 * C}, {kO, o}, {kStats, stats}};
  impl_->run(p, pack, workspace, "forward", s);
}

void FusedAttention::backward(const FusedAttentionShape& s, const uint16_t* qkv, const uint16_t* o, const uint16_t* dO,
                              const float* stats, uint16_t* dqkv, void* workspace) {
  const Impl::Plan& p = impl_->plan(s, true);
  const int64_t C = s.H * s.hd;
  auto* base = const_cast<uint16_t*>(qkv);  // inputs are read only (cuDNN takes void*)
  std::unordered_map<int64_t, void*> pack{{kQ, base},
                                          {kK, base + C},
                                          {kV, base + 2 * C},
                                          {kO, const_cast<uint16_t*>(o)},
                                          {kDO, const_cast<uint16_t*>(dO)},
                                          {kStats, const_cast<float*>(stats)},
                                          {kDQ, dqkv},
                                          {kDK, dqkv + C},
                                          {kDV, dqkv + 2 * C}};
  impl_->run(p, pack, workspace, "backward", s);
}

}  // namespace fsdp::cuda
