// CudaKernels against cpu_kernels() on random inputs, the caching allocator over the real device,
// and stream/event ordering. Skips (exit 77) when the process sees no CUDA device.
// Tolerances: bitwise for elementwise ops without libm calls, dropout, casts and the optimizer
// steps (kernel_math.h; see its header for the FMA condition); GELU a few ulp (CUDA's erff/expf
// are not glibc's); GEMMs and row reductions (different summation order) relative 1e-4 on
// values of order 1, and the f64 sums 1e-9 relative.
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/device.h"
#include "tensor/kernels.h"
#include "tensor/memory.h"

using namespace fsdp;

namespace {

struct Gpu {
  MemoryTracker tracker;
  std::unique_ptr<DeviceRuntime> rt = make_runtime(Device::cuda, tracker, 0);
  std::vector<std::pair<void*, size_t>> blocks;
  ~Gpu() {
    rt->synchronize(rt->compute_stream());
    for (auto [p, n] : blocks) rt->deallocate(p, n, MemCategory::other, rt->compute_stream());
  }
  template <class T>
  T* upload(const std::vector<T>& h) {
    size_t bytes = std::max<size_t>(1, h.size()) * sizeof(T);
    void* d = rt->allocate(bytes, MemCategory::other, rt->compute_stream());
    blocks.emplace_back(d, bytes);
    if (!h.empty()) rt->copy_async(d, h.data(), h.size() * sizeof(T), CopyKind::host_to_device, rt->compute_stream());
    rt->synchronize(rt->compute_stream());
    return static_cast<T*>(d);
  }
  template <class T>
  std::vector<T> download(const T* d, size_t n) {
    std::vector<T> h(n);
    rt->copy_async(h.data(), d, n * sizeof(T), CopyKind::device_to_host, rt->compute_stream());
    rt->synchronize(rt->compute_stream());
    return h;
  }
  Kernels& k() { return rt->kernels(); }
};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) BOOST_FAIL(what << " element " << i << ": cpu " << a[i] << " gpu " << b[i]);
}

void close(const std::vector<float>& a, const std::vector<float>& b, float rel, float abs_tol, const char* what) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    float tol = abs_tol + rel * std::fabs(a[i]);
    if (!(std::fabs(a[i] - b[i]) <= tol)) BOOST_FAIL(what << " element " << i << ": cpu " << a[i] << " gpu " << b[i]);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(elementwise_bitwise) {
  Gpu g;
  const size_t n = 100003;
  auto a = randn(n, 1), b = randn(n, 2);
  float* da = g.upload(a);
  float* db = g.upload(b);
  float* dy = g.upload(std::vector<float>(n));
  Kernels& cpu = cpu_kernels();
  std::vector<float> y(n);
  cpu.relu_forward(y.data(), a.data(), n);
  g.k().relu_forward(dy, da, n);
  same_bits(y, g.download(dy, n), "relu_forward");
  cpu.relu_backward(y.data(), a.data(), b.data(), n);
  g.k().relu_backward(dy, da, db, n);
  same_bits(y, g.download(dy, n), "relu_backward");
  cpu.add(y.data(), a.data(), b.data(), n);
  g.k().add(dy, da, db, n);
  same_bits(y, g.download(dy, n), "add");
  cpu.mul(y.data(), a.data(), b.data(), n);
  g.k().mul(dy, da, db, n);
  same_bits(y, g.download(dy, n), "mul");
  cpu.gelu_forward(y.data(), a.data(), n);
  g.k().gelu_forward(dy, da, n);
  close(y, g.download(dy, n), 1e-6f, 1e-7f, "gelu_forward");
  cpu.gelu_backward(y.data(), b.data(), a.data(), n);
  g.k().gelu_backward(dy, db, da, n);
  close(y, g.download(dy, n), 1e-6f, 1e-7f, "gelu_backward");
}

BOOST_AUTO_TEST_CASE(dropout_bitwise) {
  Gpu g;
  const int64_t B = 7, per = 1001;
  auto x = randn(B * per, 3);
  float* dx = g.upload(x);
  float* dy = g.upload(std::vector<float>(B * per));
  float* dm = g.upload(std::vector<float>(B * per));
  std::vector<float> y(B * per), m(B * per);
  cpu_kernels().dropout_forward(y.data(), m.data(), x.data(), B, per, 0.3f, 42, 99, 5);
  g.k().dropout_forward(dy, dm, dx, B, per, 0.3f, 42, 99, 5);
  same_bits(y, g.download(dy, B * per), "dropout y");
  same_bits(m, g.download(dm, B * per), "dropout mask");
}

BOOST_AUTO_TEST_CASE(gemm_and_linear) {
  Gpu g;
  const int64_t M = 37, N = 53, K = 71;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto A = randn(M * K, 4), B = randn(K * N, 5), C = randn(M * N, 6);
      int64_t lda = ta ? M : K, ldb = tb ? K : N;
      float* dA = g.upload(A);
      float* dB = g.upload(B);
      float* dC = g.upload(C);
      cpu_kernels().gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), N);
      g.k().gemm(ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, N);
      close(C, g.download(dC, M * N), 1e-4f, 1e-4f, "gemm");
    }
  }
  const int64_t rows = 33, in = 20, out = 17;
  auto X = randn(rows * in, 7), W = randn(out * in, 8), b = randn(out, 9), dY = randn(rows * out, 10);
  std::vector<float> Y(rows * out), dX(rows * in), dW(out * in, 0.5f), db(out, 0.25f);
  float* dXd = g.upload(X);
  float* dWd = g.upload(W);
  float* dbd = g.upload(b);
  float* dYd = g.upload(Y);
  cpu_kernels().linear_forward(Y.data(), X.data(), W.data(), b.data(), rows, in, out);
  g.k().linear_forward(dYd, dXd, dWd, dbd, rows, in, out);
  close(Y, g.download(dYd, rows * out), 1e-4f, 1e-4f, "linear_forward");
  float* gdY = g.upload(dY);
  float* gdX = g.upload(dX);
  float* gdW = g.upload(dW);
  float* gdb = g.upload(db);
  cpu_kernels().linear_backward(dX.data(), dW.data(), db.data(), dY.data(), X.data(), W.data(), rows, in, out);
  g.k().linear_backward(gdX, gdW, gdb, gdY, dXd, dWd, rows, in, out);
  close(dX, g.download(gdX, rows * in), 1e-4f, 1e-4f, "linear dX");
  close(dW, g.download(gdW, out * in), 1e-4f, 1e-4f, "linear dW");
  close(db, g.download(gdb, out), 1e-4f, 1e-4f, "linear db");
}

BOOST_AUTO_TEST_CASE(rows_and_losses) {
  Gpu g;
  const int64_t rows = 45, C = 300;
  auto x = randn(rows * C, 11, 2.0f), w = randn(C, 12), b = randn(C, 13), dy = randn(rows * C, 14);
  std::vector<float> y(rows * C), mean(rows), rstd(rows);
  float* gx = g.upload(x);
  float* gw = g.upload(w);
  float* gb = g.upload(b);
  float* gy = g.upload(y);
  float* gm = g.upload(mean);
  float* gr = g.upload(rstd);
  cpu_kernels().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, 1e-5f);
  g.k().layernorm_forward(gy, gm, gr, gx, gw, gb, rows, C, 1e-5f);
  close(y, g.download(gy, rows * C), 1e-4f, 1e-4f, "layernorm y");
  std::vector<float> dx(rows * C), dw(C, 0.0f), db(C, 0.0f);
  float* gdy = g.upload(dy);
  float* gdx = g.upload(dx);
  float* gdw = g.upload(dw);
  float* gdb = g.upload(db);
  cpu_kernels().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                   rstd.data(), rows, C);
  g.k().layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, gm, gr, rows, C);
  close(dx, g.download(gdx, rows * C), 1e-3f, 1e-4f, "layernorm dx");
  close(dw, g.download(gdw, C), 1e-4f, 1e-4f, "layernorm dw");
  close(db, g.download(gdb, C), 1e-4f, 1e-4f, "layernorm db");

  cpu_kernels().log_softmax_forward(y.data(), x.data(), rows, C);
  g.k().log_softmax_forward(gy, gx, rows, C);
  close(y, g.download(gy, rows * C), 1e-5f, 1e-5f, "log_softmax");
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = static_cast<int32_t>((r * 37) % C);
  int32_t* gt = g.upload(t);
  double s_cpu = 0, s_gpu = 0;
  int64_t c_cpu = 0, c_gpu = 0;
  cpu_kernels().nll_sum(y.data(), t.data(), rows, C, &s_cpu, &c_cpu);
  g.k().nll_sum(gy, gt, rows, C, &s_gpu, &c_gpu);
  BOOST_TEST(std::fabs(s_cpu - s_gpu) <= 1e-4 * std::fabs(s_cpu));
  BOOST_TEST(c_cpu == c_gpu);
  cpu_kernels().cross_entropy_backward(dx.data(), y.data(), t.data(), rows, C, 0.1f);
  g.k().cross_entropy_backward(gdx, gy, gt, rows, C, 0.1f);
  close(dx, g.download(gdx, rows * C), 1e-5f, 1e-7f, "cross_entropy_backward");
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  BOOST_TEST(std::fabs(g.k().sum_squares(gx, rows * C) - ss) <= 1e-9 * ss);
  BOOST_TEST(g.k().all_finite(gx, rows * C));
  x[77] = NAN;
  float* gx2 = g.upload(x);
  BOOST_TEST(!g.k().all_finite(gx2, rows * C));
}

BOOST_AUTO_TEST_CASE(optimizers_and_casts_bitwise) {
  Gpu g;
  const int64_t n = 5000;
  auto p = randn(n, 20), gr = randn(n, 21), m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
  float* gp = g.upload(p);
  float* gg = g.upload(gr);
  float* gm = g.upload(m);
  float* gv = g.upload(v);
  AdamWArgs a{0.9999f, 0.9f, 0.1f, 0.999f, 0.001f, 0.0316f, 1e-8f, -0.01f, true};
  for (int s = 0; s < 3; ++s) {
    cpu_kernels().adamw_step(p.data(), gr.data(), m.data(), v.data(), n, a);
    g.k().adamw_step(gp, gg, gm, gv, n, a);
  }
  same_bits(p, g.download(gp, n), "adamw p");
  same_bits(v, g.download(gv, n), "adamw v");
  SgdArgs sa{1e-3f, 0.9f, 1.0f, -0.05f, true, true, true, true};
  cpu_kernels().sgd_step(p.data(), gr.data(), m.data(), n, sa);
  g.k().sgd_step(gp, gg, gm, n, sa);
  sa.first_step = false;
  cpu_kernels().sgd_step(p.data(), gr.data(), m.data(), n, sa);
  g.k().sgd_step(gp, gg, gm, n, sa);
  same_bits(p, g.download(gp, n), "sgd p");
  AdadeltaArgs da{0.01f, 0.9f, 0.1f, 1e-6f, -1.0f, true};
  cpu_kernels().adadelta_step(p.data(), gr.data(), m.data(), v.data(), n, da);
  g.k().adadelta_step(gp, gg, gm, gv, n, da);
  same_bits(p, g.download(gp, n), "adadelta p");

  for (DType half : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> hc(n), hg(n);
    uint16_t* gh = g.upload(hg);
    cpu_kernels().cast(hc.data(), half, p.data(), DType::f32, n);
    g.k().cast(gh, half, gp, DType::f32, n);
    auto back = g.download(gh, n);
    BOOST_TEST(std::memcmp(hc.data(), back.data(), n * 2) == 0);
  }
}

BOOST_AUTO_TEST_CASE(allocator_and_stream_order) {
  MemoryTracker tracker;
  auto rt = make_runtime(Device::cuda, tracker, 0);
  Stream comp = rt->compute_stream(), comm = rt->comm_stream();
  BOOST_TEST(!(comp == comm));
  void* a = rt->allocate(3 << 20, MemCategory::params, comp);
  BOOST_TEST(rt->is_device_pointer(a));
  BOOST_TEST(tracker.current_bytes(MemCategory::params) == size_t(3 << 20));
  rt->deallocate(a, 3 << 20, MemCategory::params, comp);
  void* b = rt->allocate(3 << 20, MemCategory::params, comp);
  BOOST_TEST(a == b);  // reused at once on the same stream
  // Ordering: fill on compute, an event, the comm stream waits and copies; the copy sees the fill.
  const int64_t n = 1 << 20;
  auto* x = static_cast<float*>(b);
  void* y = rt->allocate(n * 4, MemCategory::other, comm);
  rt->kernels().fill(x, 3.0f, n);
  auto ev = rt->record(comp);
  rt->wait(comm, *ev);
  rt->copy_async(y, x, n * 4, CopyKind::device_to_device, comm);
  auto done = rt->record(comm);
  rt->synchronize(*done, 30.0);
  BOOST_TEST(done->done());
  std::vector<float> h(n);
  rt->copy_async(h.data(), y, n * 4, CopyKind::device_to_host, comm);
  rt->synchronize(comm);
  BOOST_TEST(h.front() == 3.0f);
  BOOST_TEST(h.back() == 3.0f);
  rt->deallocate(y, n * 4, MemCategory::other, comm);
  rt->deallocate(b, 3 << 20, MemCategory::params, comp);
  BOOST_TEST(tracker.current_total_bytes() == 0u);
}

namespace {
bool init_unit_test() { return true; }
}  // namespace

int main(int argc, char* argv[]) {
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("SKIP test_gpu: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  boost::unit_test::framework::master_test_suite().p_name.value = "gpu";
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
