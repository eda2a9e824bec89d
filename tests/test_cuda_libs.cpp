// cuBLAS loaded on demand (tensor/cuda/cublas_loader.h), in a -Dgpu build, on any machine: none of
// these calls needs a CUDA device, so CI (no GPU) runs them.
#define BOOST_TEST_MODULE cuda_libs
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <boost/test/unit_test.hpp>
#include <string>

#include "tensor/cuda/cublas_loader.h"
#include "tensor/cuda/cublas_sonames.h"

namespace {
bool in_process(const char* soname) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // NOLOAD took a reference
  return h != nullptr;
}
}  // namespace

// One case, in this order: the program (linked with libfsdp as fsdp_app is) starts without
// cuBLAS; load_cublas() brings both libraries in; calls then go through the loaded table.
BOOST_AUTO_TEST_CASE(cublas_is_loaded_on_demand_and_called_through_the_loader) {
  BOOST_TEST(!in_process(fsdp::cuda::kCublasSoname));
  BOOST_TEST(!in_process(fsdp::cuda::kCublasLtSoname));

  fsdp::cuda::load_cublas();
  BOOST_TEST(in_process(fsdp::cuda::kCublasSoname));
  BOOST_TEST(in_process(fsdp::cuda::kCublasLtSoname));
  const std::string from = fsdp::cuda::cublas_loaded_from();
  BOOST_TEST(from.find(std::string(fsdp::cuda::kCublasSoname) + " from /") == 0, from);
  BOOST_TEST(from.find(std::string(", ") + fsdp::cuda::kCublasLtSoname + " from /") != std::string::npos, from);

  // Host-side calls of both libraries, through the forwarding definitions.
  BOOST_TEST(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED)) == "the library was not initialized");
  cublasLtMatmulDesc_t desc = nullptr;
  BOOST_REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t transpose = CUBLAS_OP_T;
  BOOST_TEST(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose) ==
             CUBLAS_STATUS_SUCCESS);
  BOOST_TEST(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  BOOST_REQUIRE(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 64, 32, 64) == CUBLAS_STATUS_SUCCESS);
  BOOST_TEST(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  BOOST_REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const size_t workspace_bytes = 1 << 20;
  BOOST_TEST(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof workspace_bytes) == CUBLAS_STATUS_SUCCESS);
  BOOST_TEST(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
}
