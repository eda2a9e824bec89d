#include <cblas.h>

#include <vector>

#include "tensor/dtype.h"
#include "tensor/ops.h"

#if FSDP_HAVE_SBGEMM
// Debian 12's OpenBLAS 0.3.21 is built without it; newer builds declare it in cblas.h.
extern "C" void cblas_sbgemm(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                             const blasint, const blasint, const blasint, const float, const uint16_t*, const blasint,
                             const uint16_t*, const blasint, const float, float*, const blasint);
#endif

namespace fsdp::ops {

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#if FSDP_HAVE_SBGEMM
  cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
               static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
               static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
#else
  // Widen exactly the stored matrices (rows x ld), keeping the caller's strides.
  int64_t a_rows = trans_a ? K : M, b_rows = trans_b ? N : K;
  std::vector<float> a32(static_cast<size_t>(a_rows * lda)), b32(static_cast<size_t>(b_rows * ldb));
  convert(A, DType::bf16, a32.data(), DType::f32, a32.size());
  convert(B, DType::bf16, b32.data(), DType::f32, b32.size());
  gemm(trans_a, trans_b, M, N, K, alpha, a32.data(), lda, b32.data(), ldb, beta, C, ldc);
#endif
}

}  // namespace fsdp::ops
