#include "tensor/cuda/cuda_kernels.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "tensor/cuda/cublas_loader.h"
#include "tensor/cuda/launch.h"
#include "tensor/error.h"

namespace fsdp::cuda {

namespace {

constexpr size_t kResultBytes = 16;  // double sum + int64 hits
constexpr size_t kScratchBytes = kResultBytes + launch::kReduceBlocks * (sizeof(double) + sizeof(long long));

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(std::string("cuda: cuBLAS: ") + what + " = " + std::to_string(v) + " does not fit cuBLAS's 32-bit int");
  return static_cast<int>(v);
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

std::string shape(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// high and medium round their operands themselves (gemm_steps.h; matmul_precision.h says why);
// highest is cublasSgemm.

// A device block of the caching allocator, returned on the compute stream when it goes.
class StreamBlock {
 public:
  StreamBlock(CachingAllocator& allocator, size_t bytes, Stream stream)
      : allocator_(allocator), stream_(stream), ptr_(allocator.allocate(bytes, MemCategory::activations, stream)) {}
  ~StreamBlock() { allocator_.deallocate(ptr_, stream_); }
  StreamBlock(const StreamBlock&) = delete;
  StreamBlock& operator=(const StreamBlock&) = delete;
  void* get() const { return ptr_; }

 private:
  CachingAllocator& allocator_;
  Stream stream_;
  void* ptr_;
};

// An operand rounded to `precision` into a packed copy that lives as long as this.
class RoundedOperand {
 public:
  RoundedOperand(CachingAllocator& allocator, cudaStream_t stream, MatmulPrecision precision, const GemmOperand& o,
                 int64_t batch)
      : block_(allocator, static_cast<size_t>(rounded_operand_element_bytes(precision) * batch * o.rows * o.cols),
               Stream{stream}) {
    launch::round_packed(block_.get(), precision, o.data, batch, o.rows, o.cols, o.ld, o.stride, stream);
  }
  const void* get() const { return block_.get(); }

 private:
  StreamBlock block_;
};

}  // namespace

void check_cublas(cublasStatus_t rc, const char* call, const std::string& context) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuda: ") + call + ": " + cublasGetStatusString(rc) + " (" + context + ")");
}

CublasHandle::CublasHandle(cudaStream_t stream) {
  load_cublas();  // dlopen()s cuBLAS on the first CUDA runtime: a missing library is one line here
  check_cublas(cublasCreate(&handle_), "cublasCreate", "handle");
  try {
    check_cublas(cublasSetStream(handle_, stream), "cublasSetStream", "compute stream");
    // No TF32: f32 GEMMs round as the CPU's do (to summation order).
    check_cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", "default math");
  } catch (...) {
    cublasDestroy(handle_);
    throw;
  }
}

CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

CudaKernels::CudaKernels(cudaStream_t stream, CachingAllocator& allocator)
    : stream_(stream),
      allocator_(allocator),
      cublas_(stream),
      scratch_(kScratchBytes),
      host_(kResultBytes),
      fused_(stream),
      lt_bias_(stream) {}

// gemm_steps.h's executor on the device. Copies come from the caching allocator on the compute
// stream, so freeing one right after its GEMM is safe: the stream orders its next use after it.
class CudaKernels::Steps {
 public:
  explicit Steps(CudaKernels& k) : k_(k) {}
  MatmulPrecision precision() const { return k_.precision_; }
  RoundedOperand round(const GemmOperand& o, int64_t batch) const {
    return RoundedOperand(k_.allocator_, k_.stream_, k_.precision_, o, batch);
  }
  // Row-major C (M,N) is column-major C^T (N,M) = op(B)^T op(A)^T: swap the operands.
  void gemm(const GemmCall& c, const GemmOperand& a, const GemmOperand& b) const {
    if (c.batch == 1) {
      check_cublas(cublasSgemm(k_.cublas_.get(), op(c.trans_b), op(c.trans_a), to_int(c.N, "N"), to_int(c.M, "M"),
                               to_int(c.K, "K"), &c.alpha, b.data, to_int(b.ld, "ldb"), a.data, to_int(a.ld, "lda"),
                               &c.beta, c.C, to_int(c.ldc, "ldc")),
                   "cublasSgemm", shape(c.M, c.N, c.K));
      return;
    }
    check_cublas(cublasSgemmStridedBatched(k_.cublas_.get(), op(c.trans_b), op(c.trans_a), to_int(c.N, "N"),
                                           to_int(c.M, "M"), to_int(c.K, "K"), &c.alpha, b.data, to_int(b.ld, "ldb"),
                                           b.stride, a.data, to_int(a.ld, "lda"), a.stride, &c.beta, c.C,
                                           to_int(c.ldc, "ldc"), c.stride_c, to_int(c.batch, "batch")),
                 "cublasSgemmStridedBatched", shape(c.M, c.N, c.K) + " batch=" + std::to_string(c.batch));
  }
  // A product of two bf16 or two TF32 values is exact in f32: with f32 accumulation this is the
  // CPU's sgemm on its rounded copies, to summation order. FAST_TF32 on TF32 values is exact.
  void gemm_on(const GemmCall& c, const GemmOperand& a, const void* a_copy, const GemmOperand& b,
               const void* b_copy) const {
    const bool bf16 = k_.precision_ == MatmulPrecision::medium;
    // Packed copies: a row's leading dimension is its column count (at least 1 for cuBLAS).
    const auto packed_ld = [](const GemmOperand& o) { return to_int(std::max<int64_t>(o.cols, 1), "packed ld"); };
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_cublas(
        cublasGemmStridedBatchedEx(k_.cublas_.get(), op(c.trans_b), op(c.trans_a), to_int(c.N, "N"), to_int(c.M, "M"),
                                   to_int(c.K, "K"), &c.alpha, b_copy, type, packed_ld(b), b.rows * b.cols, a_copy,
                                   type, packed_ld(a), a.rows * a.cols, &c.beta, c.C, CUDA_R_32F, to_int(c.ldc, "ldc"),
                                   c.stride_c, to_int(c.batch, "batch"),
                                   bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx",
        std::string(matmul_precision_name(k_.precision_)) + " (rounded operands) " + shape(c.M, c.N, c.K) +
            " batch=" + std::to_string(c.batch));
  }
  // cuBLASLt's bias epilogue (lt_bias_gemm.h), on the f32 operands (highest) or the copies.
  bool bias_epilogue(const GemmCall& c, const GemmOperand& x, const void* x_copy, const GemmOperand& w,
                     const void* w_copy, const float* bias) const {
    if (k_.precision_ == MatmulPrecision::highest)
      return k_.lt_bias_.run(CUDA_R_32F, CUBLAS_COMPUTE_32F, x.data, w.data, bias, c.C, c.M, c.K, c.N);
    const bool bf16 = k_.precision_ == MatmulPrecision::medium;
    return k_.lt_bias_.run(bf16 ? CUDA_R_16BF : CUDA_R_32F, bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32,
                           x_copy, w_copy, bias, c.C, c.M, c.K, c.N);
  }
  void bias_rows(float* Y, const float* bias, int64_t rows, int64_t cols) const {
    launch::bias_rows(Y, bias, rows, cols, k_.stream_);
  }
  void col_sum_add(float* db, const float* dY, int64_t rows, int64_t cols) const {
    launch::col_sum_add(db, dY, rows, cols, k_.stream_);
  }

 private:
  CudaKernels& k_;
};

void CudaKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                       int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmCall c{trans_a, trans_b, M, N, K, alpha, beta, C, ldc, 0, 1};
  Steps steps(*this);
  gemm_steps(steps, c, gemm_a(c, A, lda, 0), gemm_b(c, B, ldb, 0));
}

void CudaKernels::gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                       const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                                       int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                                       int64_t batch) {
  const GemmCall c{trans_a, trans_b, M, N, K, alpha, beta, C, ldc, stride_c, batch};
  Steps steps(*this);
  gemm_steps(steps, c, gemm_a(c, A, lda, stride_a), gemm_b(c, B, ldb, stride_b));
}

void CudaKernels::gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                            int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  check_cublas(cublasGemmEx(cublas_.get(), op(trans_b), op(trans_a), to_int(N, "N"), to_int(M, "M"), to_int(K, "K"),
                            &alpha, B, CUDA_R_16BF, to_int(ldb, "ldb"), A, CUDA_R_16BF, to_int(lda, "lda"), &beta, C,
                            CUDA_R_32F, to_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx", "bf16 " + shape(M, N, K));
}

void CudaKernels::linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                                 int64_t out) {
  Steps steps(*this);
  linear_forward_steps(steps, Y, X, W, b, rows, in, out);
}

void CudaKernels::linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W,
                                  int64_t rows, int64_t in, int64_t out) {
  Steps steps(*this);
  linear_backward_steps(steps, dX, dW, db, dY, X, nullptr, W, rows, in, out);
}

void CudaKernels::linear_backward_bf16_x(float* dX, float* dW, float* db, const float* dY, const uint16_t* X,
                                         const float* W, int64_t rows, int64_t in, int64_t out) {
  require_medium_for_bf16_x();
  Steps steps(*this);
  linear_backward_steps(steps, dX, dW, db, dY, nullptr, X, W, rows, in, out);
}

void CudaKernels::im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
                         int64_t OH, int64_t OW) {
  launch::im2col(x, col, B, C, H, W, K, pad, OH, OW, stream_);
}
void CudaKernels::col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t pad, int64_t OH, int64_t OW) {
  launch::col2im(dcol, dx, B, C, H, W, K, pad, OH, OW, stream_);
}
void CudaKernels::conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) {
  launch::conv_bias_permute(y, ybuf, bias, B, out, P, stream_);
}
void CudaKernels::conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P) {
  launch::conv_grad_permute(dyt, db, dy, B, out, P, stream_);
}

void CudaKernels::relu_forward(float* y, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::relu_forward, y, x, nullptr, n, stream_);
}
void CudaKernels::relu_backward(float* dx, const float* dy, const float* y, int64_t n) {
  launch::elementwise(launch::Unary::relu_backward, dx, dy, y, n, stream_);
}
void CudaKernels::gelu_forward(float* y, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::gelu_forward, y, x, nullptr, n, stream_);
}
void CudaKernels::gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::gelu_backward, dx, dy, x, n, stream_);
}
void CudaKernels::gelu_tanh_forward(float* y, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::gelu_tanh_forward, y, x, nullptr, n, stream_);
}
void CudaKernels::gelu_tanh_backward(float* dx, const float* dy, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::gelu_tanh_backward, dx, dy, x, n, stream_);
}
void CudaKernels::silu_forward(float* y, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::silu_forward, y, x, nullptr, n, stream_);
}
void CudaKernels::silu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::silu_backward, dx, dy, x, n, stream_);
}
void CudaKernels::rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D,
                       int64_t ld, int64_t pos0, bool backward) {
  launch::rope(x, cos, sin, rows, T, heads, D, ld, pos0, backward, stream_);
}
void CudaKernels::add(float* y, const float* a, const float* b, int64_t n) {
  launch::elementwise(launch::Unary::add, y, a, b, n, stream_);
}
void CudaKernels::add_inplace(float* y, const float* x, int64_t n) {
  launch::elementwise(launch::Unary::add_inplace, y, x, nullptr, n, stream_);
}
void CudaKernels::mul(float* y, const float* a, const float* b, int64_t n) {
  launch::elementwise(launch::Unary::mul, y, a, b, n, stream_);
}
void CudaKernels::scale(float* x, float factor, int64_t n) { launch::scale(x, factor, n, stream_); }
void CudaKernels::fill(float* x, float value, int64_t n) { launch::fill(x, value, n, stream_); }

void CudaKernels::dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p,
                                  uint64_t key, uint64_t stream, int64_t sample_offset) {
  launch::dropout_forward(y, keep, x, B, per_sample, p, key, stream, sample_offset, stream_);
}
void CudaKernels::dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n) {
  launch::dropout_backward(dx, dy, keep, p, n, stream_);
}

void CudaKernels::layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                                    int64_t rows, int64_t C, float eps) {
  launch::layernorm_forward(y, mean, rstd, x, w, b, rows, C, eps, stream_);
}
void CudaKernels::layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy,
                                     const float* x, const float* w, const float* mean, const float* rstd, int64_t rows,
                                     int64_t C) {
  launch::layernorm_backward(dx, residual, dw, db, dy, x, w, mean, rstd, rows, C, stream_);
}
void CudaKernels::log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C) {
  launch::log_softmax_forward(y, x, rows, C, stream_);
}
void CudaKernels::log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C) {
  launch::log_softmax_backward(dx, dy, y, rows, C, stream_);
}
void CudaKernels::causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv) {
  launch::causal_softmax_forward(P, g, row_max, row_inv, stream_);
}
void CudaKernels::causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv) {
  launch::causal_softmax_recompute(P, g, row_max, row_inv, stream_);
}
void CudaKernels::causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale) {
  launch::causal_softmax_backward(dP, P, g, scale, stream_);
}
void CudaKernels::causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype) {
  launch::causal_softmax_flash(P, g, row_max, row_inv, dtype, stream_);
}
void CudaKernels::attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd,
                                    int64_t inv_stride, DType dtype) {
  launch::attention_rescale(y, row_inv, B, T, H, hd, inv_stride, dtype, stream_);
}
void CudaKernels::causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype) {
  launch::causal_softmax_normalize(P, g, row_inv, dtype, stream_);
}
void CudaKernels::add_layernorm_forward(float* sum, float* y, float* mean, float* rstd, const float* x,
                                        const float* residual, const float* w, const float* b, int64_t rows, int64_t C,
                                        float eps, DType dtype) {
  launch::layernorm_forward(y, mean, rstd, x, w, b, rows, C, eps, stream_, residual, sum, dtype);
}
void CudaKernels::add_rmsnorm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual,
                                      const float* w, int64_t rows, int64_t C, float eps, DType dtype) {
  launch::rmsnorm_forward(y, rstd, x, w, rows, C, eps, stream_, residual, sum, dtype);
}
void CudaKernels::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C,
                                  float eps) {
  launch::rmsnorm_forward(y, rstd, x, w, rows, C, eps, stream_);
}
void CudaKernels::rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x,
                                   const float* w, const float* rstd, int64_t rows, int64_t C) {
  launch::rmsnorm_backward(dx, residual, dw, dy, x, w, rstd, rows, C, stream_);
}
void CudaKernels::attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal,
                                            int64_t B, int64_t H, int64_t Tq, int64_t Tk) {
  launch::attention_softmax_forward(P, bias, key_valid, causal, B, H, Tq, Tk, stream_);
}
void CudaKernels::softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk) {
  launch::softmax_backward(dP, P, rows, Tk, stream_);
}
void CudaKernels::relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq,
                                        int64_t Tk) {
  launch::relative_bias_forward(bias, table, bucket, H, Tq, Tk, stream_);
}
void CudaKernels::relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H,
                                         int64_t Tq, int64_t Tk) {
  launch::relative_bias_backward(dtable, dS, bucket, B, H, Tq, Tk, stream_);
}
void CudaKernels::maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) {
  launch::maxpool2_forward(y, argmax, x, planes, H, W, stream_);
}
void CudaKernels::maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                                    int64_t W) {
  launch::maxpool2_backward(dx, dy, argmax, planes, H, W, stream_);
}
void CudaKernels::embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                                    int64_t T, int64_t C) {
  launch::embedding_forward(y, tokens, wte, wpe, B, T, C, stream_);
}
void CudaKernels::embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                                     int64_t T, int64_t C) {
  launch::embedding_backward(dwte, dwpe, dy, tokens, B, T, C, stream_);
}

void CudaKernels::fetch_results() {
  check_cuda(cudaMemcpyAsync(host_.get(), scratch_.get(), kResultBytes, cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync", "reduction result to the host");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", "compute stream, for a reduction result");
}

namespace {
struct Scratch {
  double* result;
  long long* hits;
  double* partials;
  long long* partial_hits;
};
// Typed views of the scratch bytes (device memory: the host only computes addresses).
template <class T>
T* at_offset(void* base, size_t offset_bytes) {
  return static_cast<T*>(static_cast<void*>(static_cast<char*>(base) + offset_bytes));
}
Scratch layout(void* base) {
  const size_t partial_hits = kResultBytes + launch::kReduceBlocks * sizeof(double);
  return {at_offset<double>(base, 0), at_offset<long long>(base, sizeof(double)), at_offset<double>(base, kResultBytes),
          at_offset<long long>(base, partial_hits)};
}
struct HostResult {
  double sum;
  long long hits;
};
HostResult read(const void* pinned) {
  const auto* bytes = static_cast<const char*>(pinned);
  HostResult r{};
  std::memcpy(&r.sum, bytes, sizeof r.sum);
  std::memcpy(&r.hits, bytes + sizeof(double), sizeof r.hits);
  return r;
}
}  // namespace

void CudaKernels::nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* sum,
                          int64_t* correct) {
  Scratch s = layout(scratch_.get());
  launch::nll_sum(logp, targets, rows, C, s.partials, s.partial_hits, s.result, s.hits, stream_);
  fetch_results();
  HostResult r = read(host_.get());
  *sum = r.sum;
  *correct = r.hits;
}

void CudaKernels::cross_entropy_sum(const float* logits, const int32_t* targets, int64_t rows, int64_t C, float* lse,
                                    double* sum, int64_t* correct) {
  launch::row_logsumexp(lse, logits, rows, C, stream_);
  Scratch s = layout(scratch_.get());
  launch::nll_sum(logits, targets, rows, C, s.partials, s.partial_hits, s.result, s.hits, stream_, lse);
  fetch_results();
  HostResult r = read(host_.get());
  *sum = r.sum;
  *correct = r.hits;
}
void CudaKernels::cross_entropy_backward_logits(float* d, const float* logits, const float* lse, const int32_t* targets,
                                                int64_t rows, int64_t C, float inv_n) {
  launch::cross_entropy_backward(d, logits, targets, rows, C, inv_n, stream_, lse);
}

void CudaKernels::nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g) {
  launch::nll_backward(d, targets, rows, C, g, stream_);
}
void CudaKernels::cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                                         float inv_n) {
  launch::cross_entropy_backward(d, logp, targets, rows, C, inv_n, stream_);
}

void CudaKernels::adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n,
                             const AdamWArgs& a) {
  launch::adamw_step(p, g, exp_avg, exp_avg_sq, n, a, stream_);
}
void CudaKernels::sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a) {
  launch::sgd_step(p, g, momentum_buffer, n, a, stream_);
}
void CudaKernels::adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n,
                                const AdadeltaArgs& a) {
  launch::adadelta_step(p, g, square_avg, acc_delta, n, a, stream_);
}

void CudaKernels::round_to(float* x, DType dtype, int64_t n) { launch::round_in_place(x, dtype, n, stream_); }
void CudaKernels::cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  launch::cast(dst, dst_dtype, src, src_dtype, n, stream_);
}

double CudaKernels::sum_squares(const float* x, int64_t n) {
  Scratch s = layout(scratch_.get());
  launch::sum_squares(x, n, s.partials, s.result, stream_);
  fetch_results();
  return read(host_.get()).sum;
}

bool CudaKernels::all_finite(const float* x, int64_t n) {
  Scratch s = layout(scratch_.get());
  launch::count_nonfinite(x, n, s.partial_hits, s.hits, stream_);
  fetch_results();
  return read(host_.get()).hits == 0;
}

}  // namespace fsdp::cuda
