#include "tensor/cuda/lt_bias_gemm.h"

#include <algorithm>
#include <climits>
#include <string>

#include "tensor/cuda/cuda_kernels.h"  // check_cublas
#include "tensor/error.h"

namespace fsdp::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // NVIDIA's recommendation for Hopper
// The bias vector has no alignment preference to state; below 16 bytes the epilogue is not tried.
constexpr int kMinBiasAlignment = 16;

// The largest power of two (up to 256) dividing the address: what cuBLASLt's algorithms ask of
// their operands (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256).
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % static_cast<uintptr_t>(align) != 0) align /= 2;
  return align;
}

template <typename T, cublasStatus_t (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const {
    if (p) Destroy(p);
  }
};
using MatmulDesc =
    std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using Layout =
    std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t,
                                   LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

Layout layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  check_cublas(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
               "cublasLtMatrixLayoutCreate", "bias epilogue");
  return Layout(l);
}

template <typename V>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute",
               "bias epilogue");
}

template <typename V>
void set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
               "cublasLtMatmulPreferenceSetAttribute", "bias epilogue");
}

}  // namespace

// Column-major view of the row-major GEMM (as CudaKernels::gemm): Y^T (out x rows, ld out) =
// op_T(W as in x out, ld in) * (X as in x rows, ld in), the bias one value per row of Y^T.
struct LtBiasGemm::Plan {
  MatmulDesc desc;
  Layout a, b, d;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};

LtBiasGemm::LtBiasGemm(cudaStream_t stream) : stream_(stream) {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate", "bias epilogue");
}

LtBiasGemm::~LtBiasGemm() {
  plans_.clear();  // descriptors before the handle
  if (handle_) cublasLtDestroy(handle_);
}

const LtBiasGemm::Plan& LtBiasGemm::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  const auto [type_int, compute_int, rows, in, out, align_x, align_w, align_b, align_y] = key;
  const auto type = static_cast<cudaDataType_t>(type_int);
  const auto compute = static_cast<cublasComputeType_t>(compute_int);
  auto p = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  check_cublas(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate", "bias epilogue");
  p->desc.reset(desc);
  set(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  p->a = layout(type, in, out, in);
  p->b = layout(type, in, rows, in);
  p->d = layout(CUDA_R_32F, out, rows, out);
  cublasLtMatmulPreference_t pref_raw = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref_raw), "cublasLtMatmulPreferenceCreate", "bias epilogue");
  const Preference pref(pref_raw);
  set(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_w));
  set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_x));
  set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_y));
  set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_y));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // NOT_SUPPORTED (no heuristic for this configuration) is an answer, not an error: the seeded path runs.
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(handle_, desc, p->a.get(), p->b.get(), p->d.get(),
                                                           p->d.get(), pref.get(), 1, &result, &found);
  if (rc == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
      result.workspaceSize <= kWorkspaceBytes) {
    p->algo = result.algo;
    p->ok = true;
  } else if (rc != CUBLAS_STATUS_SUCCESS && rc != CUBLAS_STATUS_NOT_SUPPORTED) {
    check_cublas(rc, "cublasLtMatmulAlgoGetHeuristic", "bias epilogue");
  }
  (void)align_b;  // part of the key only: run() does not try a bias below kMinBiasAlignment
  return *plans_.emplace(key, std::move(p)).first->second;
}

bool LtBiasGemm::run(cudaDataType_t type, cublasComputeType_t compute, const void* X, const void* W, const float* b,
                     float* Y, int64_t rows, int64_t in, int64_t out) {
  if (rows <= 0 || in <= 0 || out <= 0 || rows > INT_MAX || in > INT_MAX || out > INT_MAX) return false;
  if (alignment(b) < kMinBiasAlignment) return false;
  const Plan& p = plan(Key{static_cast<int>(type), static_cast<int>(compute), rows, in, out, alignment(X), alignment(W),
                           alignment(b), alignment(Y)});
  if (!p.ok) return false;
  if (!workspace_) workspace_ = std::make_unique<DeviceBuffer>(kWorkspaceBytes);
  set(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(b));
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(
      cublasLtMatmul(handle_, p.desc.get(), &alpha, W, p.a.get(), X, p.b.get(), &beta, Y, p.d.get(), Y, p.d.get(),
                     &p.algo, workspace_->get(), kWorkspaceBytes, stream_),
      "cublasLtMatmul",
      "bias epilogue rows=" + std::to_string(rows) + " in=" + std::to_string(in) + " out=" + std::to_string(out));
  ++runs_;
  return true;
}

}  // namespace fsdp::cuda
