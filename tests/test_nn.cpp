#define BOOST_TEST_MODULE nn
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/mnist_cnn/mnist_cnn.h"
#include "models/model.h"
#include "models/transformer/transformer.h"
#include "nn/activation_stash.h"
#include "nn/flat.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

using namespace fsdp;

namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

Tensor make_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::f32);
  BOOST_REQUIRE(static_cast<size_t>(t.numel()) == values.size());
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return make_tensor(shape, random_vec(static_cast<size_t>(shape_numel(shape)), seed, lo, hi));
}

Tensor int_tensor(const Shape& shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(shape, DType::i32);
  BOOST_REQUIRE(static_cast<size_t>(t.numel()) == values.size());
  std::copy(values.begin(), values.end(), t.i32());
  return t;
}

std::vector<float> to_vec(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// A module's parameters in one flat buffer, initialised like a run would and bound.
struct BoundParams {
  FlatLayout layout;
  std::vector<float> data, grad;
  BoundParams(Module& m, uint64_t seed)
      : layout(make_flat_layout(m.params())), data(layout.numel), grad(layout.numel, 0.0f) {
    init_flat_range(layout, data.data(), 0, layout.numel, seed);
    bind_flat(layout, data.data(), grad.data());
  }
  BoundParams(const BoundParams&) = delete;
  void zero_grad() { std::fill(grad.begin(), grad.end(), 0.0f); }
  // Moves parameters with constant init (LayerNorm ones/zeros, zero biases) to random values so
  // a gradient check exercises them.
  void perturb_constants(uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> d(-0.5f, 0.5f);
    for (size_t i = 0; i < layout.params.size(); ++i) {
      Param* p = layout.params[i];
      if (p->init.kind != ParamInit::Kind::constant) continue;
      for (int64_t j = 0; j < p->numel(); ++j) p->data[j] += d(gen);
    }
  }
  const Param* param_of(int64_t flat_index) const {
    for (size_t i = layout.params.size(); i-- > 0;)
      if (flat_index >= layout.offsets[i]) return layout.params[i];
    return nullptr;
  }
};

struct Tol {
  double eps = 1e-2;
  double atol = 2e-4;
  double rtol = 2e-3;
  // Steps to retry an element that fails at eps, with atol scaled by eps / step (float noise in
  // the loss grows as the step shrinks). For piecewise-linear models (ReLU, max pool) a step can
  // cross a kink; the estimate then converges as the step shrinks, until float noise dominates.
  std::vector<double> retry_eps = {};
};

// Central differences of `loss` w.r.t. values[idx] vs analytic[idx]. Returns the worst
// error / allowed ratio (for information).
double fd_check(const std::function<double()>& loss, float* values, const std::vector<float>& analytic,
                const std::vector<int64_t>& idx, const Tol& tol, const std::string& what,
                const std::function<std::string(int64_t)>& label = nullptr) {
  double worst = 0.0;
  int failures = 0;
  auto central = [&](int64_t i, double eps) {
    float v = values[i];
    float vp = v + static_cast<float>(eps), vm = v - static_cast<float>(eps);
    values[i] = vp;
    double lp = loss();
    values[i] = vm;
    double lm = loss();
    values[i] = v;
    return (lp - lm) / (static_cast<double>(vp) - static_cast<double>(vm));
  };
  for (int64_t i : idx) {
    double an = analytic[i];
    double fd = central(i, tol.eps);
    double allowed = tol.atol + tol.rtol * std::max(std::fabs(fd), std::fabs(an));
    double err = std::fabs(fd - an);
    for (size_t k = 0; k < tol.retry_eps.size() && err > allowed; ++k) {
      double e = tol.retry_eps[k];
      double fd2 = central(i, e);
      double allowed2 = tol.atol * tol.eps / e + tol.rtol * std::max(std::fabs(fd2), std::fabs(an));
      if (std::fabs(fd2 - an) / allowed2 < err / allowed) {
        fd = fd2;
        allowed = allowed2;
        err = std::fabs(fd2 - an);
      }
    }
    worst = std::max(worst, err / allowed);
    if (std::getenv("FD_VERBOSE"))  // with --log_level=message: every element's numbers
      BOOST_TEST_MESSAGE(what << " [" << (label ? label(i) : std::to_string(i)) << "] analytic " << an << " fd " << fd
                              << " err/allowed " << err / allowed);
    if (err > allowed && failures++ < 10) {
      BOOST_ERROR(what << " [" << (label ? label(i) : std::to_string(i)) << "]: analytic " << an << " vs fd " << fd);
    }
  }
  BOOST_TEST(failures == 0, what << ": " << failures << " of " << idx.size() << " elements off");
  return worst;
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

double weighted_sum(const Tensor& y, const std::vector<float>& R) {
  double s = 0.0;
  const float* p = y.f32();
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(p[i]) * R[i];
  return s;
}

// Gradient check of loss = sum(layer(x) * R): input gradient (if float input and requested) and
// every parameter element.
void check_layer(Layer& layer, RunCtx& ctx, Tensor x, BoundParams* params, const Tol& tol, bool check_input = true) {
  const std::string what = layer.type() + " '" + layer.name() + "'";
  Shape y_shape = layer.forward(ctx, x).shape();
  auto R = random_vec(static_cast<size_t>(shape_numel(y_shape)), 777);
  Tensor dy = make_tensor(y_shape, R);
  if (params) params->zero_grad();
  layer.forward(ctx, x);
  const Tensor& dx = layer.backward(ctx, dy);
  auto loss = [&]() { return weighted_sum(layer.forward(ctx, x), R); };
  if (check_input) {
    BOOST_REQUIRE(dx.defined());
    BOOST_TEST(dx.shape() == x.shape(), what << " dx shape " << shape_str(dx.shape()));
    std::vector<float> dx_an = to_vec(dx);
    double w = fd_check(loss, x.f32(), dx_an, all_indices(x.numel()), tol, what + " input");
    BOOST_TEST_MESSAGE(what << " input worst " << w);
  }
  if (params) {
    std::vector<float> g_an = params->grad;
    auto label = [&](int64_t i) {
      const Param* p = params->param_of(i);
      return p ? p->name + "@" + std::to_string(i) : std::to_string(i);
    };
    double w =
        fd_check(loss, params->data.data(), g_an, all_indices(params->layout.numel), tol, what + " params", label);
    BOOST_TEST_MESSAGE(what << " params worst " << w);
  }
}

std::vector<std::string> param_names(Module& m) {
  std::vector<std::string> out;
  for (Param* p : m.params()) out.push_back(p->name);
  return out;
}

}  // namespace

// =============================================================================================
BOOST_AUTO_TEST_SUITE(gradients)

BOOST_AUTO_TEST_CASE(linear_2d_and_3d) {
  RunCtx ctx;
  Linear lin("proj", 5, 4);
  BOOST_TEST(param_names(lin) == (std::vector<std::string>{"proj.weight", "proj.bias"}));
  BoundParams b(lin, 1);
  check_layer(lin, ctx, random_tensor({3, 5}, 2), &b, Tol{});
  Tensor x3 = random_tensor({2, 3, 5}, 3);
  check_layer(lin, ctx, x3, &b, Tol{});
  BOOST_TEST(lin.forward(ctx, x3).shape() == (Shape{2, 3, 4}));
  // No bias.
  Linear nb("nb", 6, 3, false);
  BOOST_TEST(nb.bias == nullptr);
  BOOST_TEST(param_names(nb) == (std::vector<std::string>{"nb.weight"}));
  BoundParams bn(nb, 4);
  check_layer(nb, ctx, random_tensor({4, 6}, 5), &bn, Tol{});
  BOOST_CHECK_THROW(lin.forward(ctx, random_tensor({3, 4}, 1)), Error);
}

BOOST_AUTO_TEST_CASE(linear_grads_accumulate_and_skip_input_grad) {
  RunCtx ctx;
  Linear lin("l", 4, 3);
  BoundParams b(lin, 9);
  Tensor x = random_tensor({5, 4}, 1);
  Tensor dy = random_tensor({5, 3}, 2);
  lin.forward(ctx, x);
  lin.backward(ctx, dy);
  std::vector<float> g1 = b.grad;
  lin.forward(ctx, x);
  lin.backward(ctx, dy);
  for (size_t i = 0; i < g1.size(); ++i) BOOST_TEST(std::fabs(b.grad[i] - 2 * g1[i]) < 1e-5);
  Linear first("f", 4, 3);
  first.need_input_grad = false;
  BoundParams bf(first, 9);
  first.forward(ctx, x);
  const Tensor& dx = first.backward(ctx, dy);
  BOOST_TEST(!dx.defined());
  for (size_t i = 0; i < g1.size(); ++i) BOOST_TEST(std::fabs(bf.grad[i] - g1[i]) < 1e-6);
}

BOOST_AUTO_TEST_CASE(conv2d_padding_0_and_1) {
  RunCtx ctx;
  for (int64_t pad : {0, 1}) {
    Conv2d conv("conv", 3, 4, 3, pad);
    BOOST_TEST(param_names(conv) == (std::vector<std::string>{"conv.weight", "conv.bias"}));
    BoundParams b(conv, 10 + pad);
    Tensor x = random_tensor({2, 3, 5, 6}, 20 + pad);
    BOOST_TEST(conv.forward(ctx, x).shape() == (Shape{2, 4, 3 + 2 * pad, 4 + 2 * pad}));
    check_layer(conv, ctx, x, &b, Tol{});
    // Forward against a direct convolution.
    const Tensor& y = conv.forward(ctx, x);
    int64_t OH = y.dim(2), OW = y.dim(3);
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t o = 0; o < 4; ++o)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            double s = conv.bias.data[o];
            for (int64_t c = 0; c < 3; ++c)
              for (int64_t kh = 0; kh < 3; ++kh)
                for (int64_t kw = 0; kw < 3; ++kw) {
                  int64_t ih = oh + kh - pad, iw = ow + kw - pad;
                  if (ih < 0 || ih >= 5 || iw < 0 || iw >= 6) continue;
                  s += static_cast<double>(conv.weight.data[((o * 3 + c) * 3 + kh) * 3 + kw]) *
                       x.f32()[((n * 3 + c) * 5 + ih) * 6 + iw];
                }
            BOOST_TEST_REQUIRE(std::fabs(y.f32()[((n * 4 + o) * OH + oh) * OW + ow] - s) < 1e-5);
          }
  }
  Conv2d conv("c", 3, 4, 3);
  BoundParams b(conv, 1);
  BOOST_CHECK_THROW(conv.forward(ctx, random_tensor({2, 2, 5, 5}, 1)), Error);
  BOOST_CHECK_THROW(conv.forward(ctx, random_tensor({3, 5, 5}, 1)), Error);
}

BOOST_AUTO_TEST_CASE(conv2d_batch_change_and_no_input_grad) {
  RunCtx ctx;
  Conv2d conv("c", 2, 3, 3, 1);
  conv.need_input_grad = false;
  BoundParams b(conv, 5);
  // Batch of 3 then batch of 1 (buffers reallocated) — the gradient check still holds.
  Tensor dy3 = random_tensor({3, 3, 4, 4}, 2);
  conv.forward(ctx, random_tensor({3, 2, 4, 4}, 1));
  BOOST_TEST(!conv.backward(ctx, dy3).defined());
  check_layer(conv, ctx, random_tensor({1, 2, 4, 4}, 3), &b, Tol{}, /*check_input=*/false);
  // Per-sample results don't depend on the batch they're in.
  Tensor x2 = random_tensor({2, 2, 4, 4}, 4);
  std::vector<float> y2 = to_vec(conv.forward(ctx, x2));
  Tensor x1 = make_tensor({1, 2, 4, 4}, std::vector<float>(x2.f32() + 32, x2.f32() + 64));
  std::vector<float> y1 = to_vec(conv.forward(ctx, x1));
  for (int i = 0; i < 48; ++i) BOOST_TEST(std::fabs(y1[i] - y2[48 + i]) < 1e-6);
}

BOOST_AUTO_TEST_CASE(relu) {
  RunCtx ctx;
  ReLU relu("r");
  // Values at least 0.1 away from the kink.
  auto v = random_vec(2 * 3 * 4, 5, 0.1f, 1.0f);
  std::mt19937 gen(1);
  for (auto& x : v)
    if (gen() & 1) x = -x;
  check_layer(relu, ctx, make_tensor({2, 3, 4}, v), nullptr, Tol{});
}

BOOST_AUTO_TEST_CASE(gelu) {
  RunCtx ctx;
  GELU g("g");
  check_layer(g, ctx, random_tensor({3, 7}, 6, -3.0f, 3.0f), nullptr, Tol{});
}

BOOST_AUTO_TEST_CASE(maxpool2d) {
  RunCtx ctx;
  MaxPool2d mp("mp");
  for (Shape s : {Shape{2, 3, 4, 4}, Shape{1, 2, 5, 7}}) {
    // Distinct values 0.05 apart: a 0.01 perturbation never changes the argmax.
    int64_t n = shape_numel(s);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = 0.05f * static_cast<float>(i) - 1.0f;
    std::shuffle(v.begin(), v.end(), std::mt19937(static_cast<uint32_t>(n)));
    Tensor x = make_tensor(s, v);
    BOOST_TEST(mp.forward(ctx, x).shape() == (Shape{s[0], s[1], s[2] / 2, s[3] / 2}));
    check_layer(mp, ctx, x, nullptr, Tol{});
  }
  BOOST_CHECK_THROW(mp.forward(ctx, random_tensor({4, 4}, 1)), Error);
}

BOOST_AUTO_TEST_CASE(flatten) {
  RunCtx ctx;
  Flatten f("f");
  Tensor x = random_tensor({2, 3, 2, 2}, 8);
  const Tensor& y = f.forward(ctx, x);
  BOOST_TEST(y.shape() == (Shape{2, 12}));
  BOOST_TEST(y.raw() == x.raw());  // a view
  check_layer(f, ctx, x, nullptr, Tol{});
}

BOOST_AUTO_TEST_CASE(log_softmax) {
  RunCtx ctx;
  LogSoftmax ls("ls");
  check_layer(ls, ctx, random_tensor({3, 6}, 9, -2.0f, 2.0f), nullptr, Tol{});
  check_layer(ls, ctx, random_tensor({2, 2, 5}, 10, -2.0f, 2.0f), nullptr, Tol{});
}

BOOST_AUTO_TEST_CASE(layernorm) {
  RunCtx ctx;
  LayerNorm ln("ln", 6);
  BOOST_TEST(param_names(ln) == (std::vector<std::string>{"ln.weight", "ln.bias"}));
  BoundParams b(ln, 3);
  for (int i = 0; i < 6; ++i) {
    BOOST_TEST(ln.weight.data[i] == 1.0f);
    BOOST_TEST(ln.bias.data[i] == 0.0f);
  }
  b.perturb_constants(4);
  check_layer(ln, ctx, random_tensor({2, 3, 6}, 11, -2.0f, 2.0f), &b, Tol{});
  BOOST_CHECK_THROW(ln.forward(ctx, random_tensor({2, 5}, 1)), Error);
}

// backward_adding(dy, r) = r + backward(dy), bit for bit, with the same weight gradients; a
// residual of another shape is refused by name and leaves nothing behind for the next backward.
BOOST_AUTO_TEST_CASE(layernorm_backward_adding) {
  RunCtx ctx;
  ctx.training = true;
  LayerNorm ln("blocks.0.ln2", 6);
  BoundParams b(ln, 3);
  b.perturb_constants(4);
  const Tensor x = random_tensor({2, 3, 6}, 11, -2.0f, 2.0f), dy = random_tensor({2, 3, 6}, 12);
  const Tensor r = random_tensor({2, 3, 6}, 13);
  ln.forward(ctx, x);
  const Tensor dx = ln.backward(ctx, dy);
  const std::vector<float> dx_plain(dx.f32(), dx.f32() + dx.numel()), grad_plain = b.grad;
  b.zero_grad();
  ln.forward(ctx, x);
  const Tensor sum = ln.backward_adding(ctx, dy, r);
  BOOST_TEST(b.grad == grad_plain);
  for (int64_t i = 0; i < sum.numel(); ++i) {
    BOOST_TEST_INFO("element " << i);
    BOOST_TEST(sum.f32()[i] == r.f32()[i] + dx_plain[static_cast<size_t>(i)]);
  }
  ln.forward(ctx, x);
  try {
    ln.backward_adding(ctx, dy, random_tensor({2, 6}, 14));
    BOOST_FAIL("a residual of another shape was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "blocks.0.ln2: residual gradient [2, 6] is not the input's [2, 3, 6]");
  }
  ln.forward(ctx, x);
  const Tensor again = ln.backward(ctx, dy);
  for (int64_t i = 0; i < again.numel(); ++i) BOOST_TEST(again.f32()[i] == dx_plain[static_cast<size_t>(i)]);
}

BOOST_AUTO_TEST_CASE(embeddings) {
  RunCtx ctx;
  Embeddings emb(7, 6, 4);
  BOOST_TEST(param_names(emb) == (std::vector<std::string>{"tok_emb.weight", "pos_emb.weight"}));
  BOOST_TEST(emb.tok.weight.shape == (Shape{7, 4}));
  BOOST_TEST(emb.pos.weight.shape == (Shape{6, 4}));
  BoundParams b(emb, 5);
  // Repeated tokens: their gradients add up. T = 5 < max_seq.
  Tensor tokens = int_tensor({2, 5}, {1, 3, 3, 0, 6, 3, 1, 2, 2, 3});
  const Tensor& y = emb.forward(ctx, tokens);
  BOOST_TEST(y.shape() == (Shape{2, 5, 4}));
  for (int64_t i = 0; i < 10; ++i)
    for (int64_t c = 0; c < 4; ++c)
      BOOST_TEST(y.f32()[i * 4 + c] ==
                 emb.tok.weight.data[tokens.i32()[i] * 4 + c] + emb.pos.weight.data[(i % 5) * 4 + c]);
  check_layer(emb, ctx, tokens, &b, Tol{}, /*check_input=*/false);
  // Rows of tokens never used get exactly zero gradient; so does the unused position 5.
  for (int c = 0; c < 4; ++c) {
    BOOST_TEST(emb.tok.weight.grad[4 * 4 + c] == 0.0f);
    BOOST_TEST(emb.tok.weight.grad[5 * 4 + c] == 0.0f);
    BOOST_TEST(emb.pos.weight.grad[5 * 4 + c] == 0.0f);
  }
  BOOST_CHECK_THROW(emb.forward(ctx, int_tensor({1, 2}, {0, 7})), Error);
  BOOST_CHECK_THROW(emb.forward(ctx, int_tensor({1, 2}, {-1, 0})), Error);
  BOOST_CHECK_THROW(emb.forward(ctx, int_tensor({1, 7}, {0, 0, 0, 0, 0, 0, 0})), Error);
  BOOST_CHECK_THROW(emb.forward(ctx, int_tensor({6}, {0, 0, 0, 0, 0, 0})), Error);
}

BOOST_AUTO_TEST_CASE(multihead_attention_causal) {
  RunCtx ctx;
  MultiheadAttention attn("attn", 8, 2);
  BOOST_TEST(param_names(attn) == (std::vector<std::string>{"attn.in_proj_weight", "attn.in_proj_bias",
                                                            "attn.out_proj.weight", "attn.out_proj.bias"}));
  BoundParams b(attn, 6);
  b.perturb_constants(7);  // in_proj_bias, out_proj.bias
  // T 5 is one GEMM block; T 70 runs the host kernels' blocked causal GEMMs (rows in blocks of
  // causal_row_block: 32, 32 and a last, shorter one).
  BOOST_TEST_REQUIRE(cpu_kernels().causal_row_block(5) == 5);
  BOOST_TEST_REQUIRE(cpu_kernels().causal_row_block(70) < 35);
  for (const int64_t T : {int64_t{5}, int64_t{70}}) {
    BOOST_TEST_CONTEXT("T " << T) {
      Tensor x = random_tensor({2, T, 8}, 12);
      check_layer(attn, ctx, x, &b, Tol{});

      // Forward against a direct double computation of causal softmax attention.
      const Tensor& y = attn.forward(ctx, x);
      const int64_t B = 2, C = 8, H = 2, hd = 4;
      std::vector<double> qkv(B * T * 3 * C), o(B * T * C);
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t j = 0; j < 3 * C; ++j) {
          double s = attn.in_proj_bias.data[j];
          for (int64_t c = 0; c < C; ++c)
            s += static_cast<double>(attn.in_proj_weight.data[j * C + c]) * x.f32()[r * C + c];
          qkv[r * 3 * C + j] = s;
        }
      for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < T; ++i) {
            std::vector<double> sc(i + 1);
            double mx = -1e300;
            for (int64_t j = 0; j <= i; ++j) {
              double s = 0.0;
              for (int64_t d = 0; d < hd; ++d)
                s += qkv[(bb * T + i) * 3 * C + h * hd + d] * qkv[(bb * T + j) * 3 * C + C + h * hd + d];
              sc[j] = s / std::sqrt(static_cast<double>(hd));
              mx = std::max(mx, sc[j]);
            }
            double z = 0.0;
            for (auto& s : sc) z += (s = std::exp(s - mx));
            for (int64_t d = 0; d < hd; ++d) {
              double acc = 0.0;
              for (int64_t j = 0; j <= i; ++j) acc += sc[j] / z * qkv[(bb * T + j) * 3 * C + 2 * C + h * hd + d];
              o[(bb * T + i) * C + h * hd + d] = acc;
            }
          }
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t j = 0; j < C; ++j) {
          double s = attn.out_proj.bias->data[j];
          for (int64_t c = 0; c < C; ++c) s += attn.out_proj.weight.data[j * C + c] * o[r * C + c];
          BOOST_TEST_REQUIRE(std::fabs(y.f32()[r * C + j] - s) < 1e-5);
        }

      // Causality: changing the last position leaves the earlier outputs untouched.
      std::vector<float> y0 = to_vec(attn.forward(ctx, x));
      x.f32()[(0 * T + T - 1) * C + 3] += 1.0f;
      std::vector<float> y1 = to_vec(attn.forward(ctx, x));
      for (int64_t i = 0; i < (T - 1) * C; ++i) BOOST_TEST_REQUIRE(y0[i] == y1[i]);
      BOOST_TEST(y0[(T - 1) * C] != y1[(T - 1) * C]);
    }
  }
  BOOST_CHECK_THROW(MultiheadAttention("bad", 8, 3), Error);
}

// model.attention: recompute against the materialised attention, same parameters: the forward is
// the same arithmetic (bitwise); the backward recomputes P bit for bit, so dq matches too, while
// dk, dv and what follows from them sum over row blocks in another order (T 70: host blocks of
// 32, 32, 6): within 1e-5 relative of the largest gradient. Its own gradient check as well.
BOOST_AUTO_TEST_CASE(multihead_attention_recompute) {
  RunCtx ctx;
  MultiheadAttention mat("attn", 8, 2), rec("attn", 8, 2, AttentionMode::recompute);
  BoundParams bm(mat, 6), br(rec, 6);
  bm.perturb_constants(7);
  br.perturb_constants(7);
  BOOST_TEST_REQUIRE(bm.data == br.data);
  for (const int64_t T : {int64_t{5}, int64_t{70}}) {
    BOOST_TEST_CONTEXT("T " << T) {
      Tensor x = random_tensor({2, T, 8}, 21);
      Tensor dy = random_tensor({2, T, 8}, 22);
      bm.zero_grad();
      br.zero_grad();
      const std::vector<float> ym = to_vec(mat.forward(ctx, x)), yr = to_vec(rec.forward(ctx, x));
      BOOST_TEST(std::memcmp(ym.data(), yr.data(), ym.size() * sizeof(float)) == 0);
      const std::vector<float> dxm = to_vec(mat.backward(ctx, dy)), dxr = to_vec(rec.backward(ctx, dy));
      auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
        float scale = 0.0f;
        for (float v : a) scale = std::max(scale, std::fabs(v));
        for (size_t i = 0; i < a.size(); ++i)
          BOOST_TEST_REQUIRE(std::fabs(a[i] - b[i]) <= 1e-5f * scale, what << " element " << i);
      };
      close(dxm, dxr, "dx");
      close(bm.grad, br.grad, "parameter grads");
      check_layer(rec, ctx, x, &br, Tol{});
    }
  }
}

BOOST_AUTO_TEST_CASE(transformer_block) {
  RunCtx ctx;
  TransformerBlock blk("blocks.0", 8, 2, 16);
  BOOST_TEST(param_names(blk) ==
             (std::vector<std::string>{"blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.attn.in_proj_weight",
                                       "blocks.0.attn.in_proj_bias", "blocks.0.attn.out_proj.weight",
                                       "blocks.0.attn.out_proj.bias", "blocks.0.ln2.weight", "blocks.0.ln2.bias",
                                       "blocks.0.fc1.weight", "blocks.0.fc1.bias", "blocks.0.fc2.weight",
                                       "blocks.0.fc2.bias"}));
  BoundParams b(blk, 8);
  b.perturb_constants(9);
  check_layer(blk, ctx, random_tensor({2, 5, 8}, 13), &b, Tol{});
}

BOOST_AUTO_TEST_CASE(nll_loss) {
  RunCtx ctx;
  NLLLoss nll;
  const int64_t N = 4, C = 5;
  Tensor x = random_tensor({N, C}, 14, -3.0f, 0.0f);
  Tensor t = int_tensor({N}, {2, 0, 4, 4});
  for (double norm : {4.0, 10.0}) {
    ctx.loss_normalizer = norm;
    double L = nll.forward(ctx, x, t);
    double want = 0.0;
    int64_t correct = 0;
    for (int64_t r = 0; r < N; ++r) {
      want -= x.f32()[r * C + t.i32()[r]];
      int64_t best = std::max_element(x.f32() + r * C, x.f32() + (r + 1) * C) - (x.f32() + r * C);
      correct += best == t.i32()[r];
    }
    BOOST_TEST(std::fabs(L - want / norm) < 1e-12);
    BOOST_TEST(std::fabs(nll.last_sum() - want) < 1e-12);
    BOOST_TEST(nll.last_correct() == correct);
    const Tensor& g = nll.backward(ctx);
    BOOST_TEST(g.shape() == x.shape());
    std::vector<float> an = to_vec(g);
    fd_check([&] { return nll.forward(ctx, x, t); }, x.f32(), an, all_indices(N * C), Tol{1e-2, 1e-6, 1e-4}, "nll");
  }
  // Every row right: last_correct = N.
  Tensor x2 = make_tensor({2, 3}, {-0.1f, -3.0f, -3.0f, -2.0f, -2.0f, -0.2f});
  nll.forward(ctx, x2, int_tensor({2}, {0, 2}));
  BOOST_TEST(nll.last_correct() == 2);
  BOOST_CHECK_THROW(nll.forward(ctx, x, int_tensor({N}, {0, 1, 5, 0})), Error);
  BOOST_CHECK_THROW(nll.forward(ctx, x, int_tensor({N}, {0, -1, 2, 0})), Error);
  BOOST_CHECK_THROW(nll.forward(ctx, x, int_tensor({3}, {0, 1, 2})), Error);
}

BOOST_AUTO_TEST_CASE(cross_entropy_loss) {
  RunCtx ctx;
  CrossEntropyLoss ce;
  // (B, T, V) logits with (B, T) targets, as the LM uses it.
  const int64_t B = 2, T = 3, V = 5, N = B * T;
  Tensor x = random_tensor({B, T, V}, 15, -2.0f, 2.0f);
  Tensor t = int_tensor({B, T}, {0, 4, 2, 2, 1, 3});
  ctx.loss_normalizer = static_cast<double>(N);
  double L = ce.forward(ctx, x, t);
  double want = 0.0;
  for (int64_t r = 0; r < N; ++r) {
    const float* row = x.f32() + r * V;
    double mx = *std::max_element(row, row + V), z = 0.0;
    for (int64_t c = 0; c < V; ++c) z += std::exp(row[c] - mx);
    want += mx + std::log(z) - row[t.i32()[r]];
  }
  BOOST_TEST(std::fabs(L - want / N) < 1e-5);
  BOOST_TEST(std::fabs(ce.last_sum() - want) < 1e-5);
  const std::vector<float> logits_before = to_vec(x);
  const Tensor& g = ce.backward(ctx);
  BOOST_TEST(g.shape() == x.shape());
  BOOST_TEST(g.raw() == x.raw());  // the gradient is written over the logits
  std::vector<float> an = to_vec(g);
  std::copy(logits_before.begin(), logits_before.end(), x.f32());
  // Each row of the gradient sums to zero.
  for (int64_t r = 0; r < N; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < V; ++c) s += an[r * V + c];
    BOOST_TEST(std::fabs(s) < 1e-6);
  }
  fd_check([&] { return ce.forward(ctx, x, t); }, x.f32(), an, all_indices(N * V), Tol{1e-2, 2e-5, 1e-3}, "ce");
  BOOST_CHECK_THROW(ce.forward(ctx, x, int_tensor({B, T}, {0, 5, 0, 0, 0, 0})), Error);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
BOOST_AUTO_TEST_SUITE(dropout)

BOOST_AUTO_TEST_CASE(mask_values_and_backward) {
  const float p = 0.4f;
  Dropout d("drop", p);
  RunCtx ctx;
  ctx.seed = 3;
  ctx.step = 7;
  Tensor x = random_tensor({4, 10, 25}, 16, 0.5f, 1.5f);  // nonzero: y / x reveals the mask
  const Tensor& y = d.forward(ctx, x);
  BOOST_TEST(y.raw() != x.raw());
  const float scale = 1.0f / (1.0f - p);
  std::vector<float> mask(x.numel());
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    float yi = y.f32()[i];
    if (yi == 0.0f) {
      mask[i] = 0.0f;
      ++dropped;
    } else {
      BOOST_TEST_REQUIRE(yi == x.f32()[i] * scale);
      mask[i] = scale;
    }
  }
  double frac = static_cast<double>(dropped) / static_cast<double>(x.numel());
  BOOST_TEST(std::fabs(frac - p) < 0.05, "dropped fraction " << frac);  // sigma ~ 0.014
  Tensor dy = random_tensor(x.shape(), 17);
  const Tensor& dx = d.backward(ctx, dy);
  BOOST_TEST(dx.shape() == x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) BOOST_TEST_REQUIRE(dx.f32()[i] == dy.f32()[i] * mask[i]);
  // And the finite-difference check (the mask is fixed for a fixed (seed, step, sample)).
  check_layer(d, ctx, random_tensor({2, 3, 4}, 18), nullptr, Tol{});
}

BOOST_AUTO_TEST_CASE(mask_independent_of_batch_split) {
  const float p = 0.5f;
  RunCtx ctx;
  ctx.seed = 11;
  ctx.step = 2;
  Tensor x = random_tensor({4, 3, 5}, 19, 0.5f, 1.5f);
  Dropout full("fc.dropout", p);
  std::vector<float> y_full = to_vec(full.forward(ctx, x));
  const int64_t per = 15;
  for (int64_t split : {1, 2, 3}) {
    Dropout part("fc.dropout", p);  // a separate instance (another rank) with the same name
    std::vector<float> y_parts;
    for (int64_t start = 0; start < 4; start += split) {
      int64_t n = std::min<int64_t>(split, 4 - start);
      Tensor xs = make_tensor({n, 3, 5}, std::vector<float>(x.f32() + start * per, x.f32() + (start + n) * per));
      ctx.sample_offset = start;
      std::vector<float> ys = to_vec(part.forward(ctx, xs));
      y_parts.insert(y_parts.end(), ys.begin(), ys.end());
    }
    BOOST_TEST(y_parts == y_full, "split " << split);
  }
  ctx.sample_offset = 0;
  // Without the offset the second half would repeat the first half's mask, not the full one.
  {
    Tensor xs = make_tensor({2, 3, 5}, std::vector<float>(x.f32() + 2 * per, x.f32() + 4 * per));
    std::vector<float> ys = to_vec(full.forward(ctx, xs));
    BOOST_TEST(!std::equal(ys.begin(), ys.end(), y_full.begin() + 2 * per));
  }
  // A different step, seed or layer name gives a different mask.
  Dropout other("fc.dropout", p);
  ctx.step = 3;
  BOOST_TEST(to_vec(other.forward(ctx, x)) != y_full);
  ctx.step = 2;
  ctx.seed = 12;
  BOOST_TEST(to_vec(other.forward(ctx, x)) != y_full);
  ctx.seed = 11;
  BOOST_TEST(to_vec(other.forward(ctx, x)) == y_full);
  Dropout renamed("other.dropout", p);
  BOOST_TEST(to_vec(renamed.forward(ctx, x)) != y_full);
}

BOOST_AUTO_TEST_CASE(identity_when_off) {
  Tensor x = random_tensor({3, 4}, 20);
  Tensor dy = random_tensor({3, 4}, 21);
  Dropout d("d", 0.5f);
  RunCtx ctx;
  ctx.training = false;
  const Tensor& y = d.forward(ctx, x);
  BOOST_TEST(y.raw() == x.raw());
  BOOST_TEST(d.backward(ctx, dy).raw() == dy.raw());
  ctx.training = true;
  ctx.dropout = false;
  BOOST_TEST(d.forward(ctx, x).raw() == x.raw());
  BOOST_TEST(d.backward(ctx, dy).raw() == dy.raw());
  ctx.dropout = true;
  Dropout zero("z", 0.0f);
  BOOST_TEST(zero.forward(ctx, x).raw() == x.raw());
  BOOST_TEST(zero.backward(ctx, dy).raw() == dy.raw());
  // Turned on again, the same layer masks.
  std::vector<float> yv = to_vec(d.forward(ctx, x));
  BOOST_TEST(std::count(yv.begin(), yv.end(), 0.0f) > 0);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
BOOST_AUTO_TEST_SUITE(models)

BOOST_AUTO_TEST_CASE(mnist_cnn_structure) {
  auto m = make_mnist_cnn();
  BOOST_TEST(m->name() == "");
  auto ps = m->params();
  std::vector<std::string> names = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                    "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
  std::vector<Shape> shapes = {{32, 1, 3, 3}, {32}, {64, 32, 3, 3}, {64}, {128, 9216}, {128}, {10, 128}, {10}};
  BOOST_REQUIRE(ps.size() == names.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    BOOST_TEST(ps[i]->name == names[i]);
    BOOST_TEST(ps[i]->shape == shapes[i], ps[i]->name << " " << shape_str(ps[i]->shape));
  }
  BOOST_TEST(m->num_params() == 1199882);
  std::vector<std::string> layer_names, layer_types;
  for (Layer* l : m->layers()) {
    layer_names.push_back(l->name());
    layer_types.push_back(l->type());
  }
  BOOST_TEST(layer_names == (std::vector<std::string>{"conv1", "relu1", "conv2", "relu2", "max_pool", "dropout1",
                                                      "flatten", "fc1", "relu3", "dropout2", "fc2", "log_softmax"}));
  BOOST_TEST(layer_types == (std::vector<std::string>{"Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout",
                                                      "Flatten", "Linear", "ReLU", "Dropout", "Linear", "LogSoftmax"}));
}

BOOST_AUTO_TEST_CASE(transformer_structure) {
  const int64_t V = 256, C = 32, L = 2, H = 4, F = 64, S = 16;
  auto m = make_transformer(V, C, L, H, F, S);
  std::vector<std::pair<std::string, Shape>> want = {{"tok_emb.weight", {V, C}}, {"pos_emb.weight", {S, C}}};
  for (int i = 0; i < L; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, Shape>> blk = {{b + "ln1.weight", {C}},
                                                      {b + "ln1.bias", {C}},
                                                      {b + "attn.in_proj_weight", {3 * C, C}},
                                                      {b + "attn.in_proj_bias", {3 * C}},
                                                      {b + "attn.out_proj.weight", {C, C}},
                                                      {b + "attn.out_proj.bias", {C}},
                                                      {b + "ln2.weight", {C}},
                                                      {b + "ln2.bias", {C}},
                                                      {b + "fc1.weight", {F, C}},
                                                      {b + "fc1.bias", {F}},
                                                      {b + "fc2.weight", {C, F}},
                                                      {b + "fc2.bias", {C}}};
    want.insert(want.end(), blk.begin(), blk.end());
  }
  want.push_back({"ln_f.weight", {C}});
  want.push_back({"ln_f.bias", {C}});
  want.push_back({"head.weight", {V, C}});
  want.push_back({"head.bias", {V}});
  auto ps = m->params();
  BOOST_REQUIRE(ps.size() == want.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    BOOST_TEST(ps[i]->name == want[i].first);
    BOOST_TEST(ps[i]->shape == want[i].second, ps[i]->name << " " << shape_str(ps[i]->shape));
  }
  BOOST_TEST(m->num_params() == 34304);
  std::vector<std::string> layer_types;
  for (Layer* l : m->layers()) layer_types.push_back(l->type());
  BOOST_TEST(layer_types ==
             (std::vector<std::string>{"Embeddings", "TransformerBlock", "TransformerBlock", "LayerNorm", "Linear"}));
  BOOST_TEST(m->layers()[1]->name() == "blocks.0");
  BOOST_TEST(m->layers()[4]->name() == "head");
  BOOST_CHECK_THROW(make_transformer(V, 30, L, 4, F, S), Error);
}

BOOST_AUTO_TEST_CASE(init_rules) {
  const uint64_t seed = 5;
  auto check_uniform = [&](const Param& p, const float* v, double bound) {
    BOOST_TEST((p.init.kind == ParamInit::Kind::uniform), p.name);
    BOOST_TEST(std::fabs(p.init.a + bound) < 1e-6 * bound, p.name);
    BOOST_TEST(std::fabs(p.init.b - bound) < 1e-6 * bound, p.name);
    float mn = *std::min_element(v, v + p.numel()), mx = *std::max_element(v, v + p.numel());
    BOOST_TEST(mn >= -bound, p.name);
    BOOST_TEST(mx <= bound, p.name);
    // Spread over the range: with n draws the extremes are within ~2*bound/n of the ends.
    double slack = 2.0 * bound * 10.0 / static_cast<double>(p.numel());
    BOOST_TEST(mn < -bound + slack, p.name << " min " << mn);
    BOOST_TEST(mx > bound - slack, p.name << " max " << mx);
    double mean = std::accumulate(v, v + p.numel(), 0.0) / p.numel();
    BOOST_TEST(std::fabs(mean) < 4.0 * bound / std::sqrt(3.0 * p.numel()), p.name << " mean " << mean);
  };
  auto check_const = [&](const Param& p, const float* v, float c) {
    BOOST_TEST((p.init.kind == ParamInit::Kind::constant), p.name);
    for (int64_t i = 0; i < p.numel(); ++i) BOOST_TEST_REQUIRE(v[i] == c, p.name);
  };
  {
    Linear lin("lin", 100, 50);
    BoundParams b(lin, seed);
    check_uniform(lin.weight, lin.weight.data, 0.1);
    check_uniform(*lin.bias, lin.bias->data, 0.1);
  }
  {
    Conv2d conv("conv", 3, 40, 3);
    BoundParams b(conv, seed);
    check_uniform(conv.weight, conv.weight.data, 1.0 / std::sqrt(27.0));
    check_uniform(conv.bias, conv.bias.data, 1.0 / std::sqrt(27.0));
  }
  {
    Embeddings emb(1000, 50, 16);
    BoundParams b(emb, seed);
    for (const Param* p : {&emb.tok.weight, &emb.pos.weight}) {
      BOOST_TEST((p->init.kind == ParamInit::Kind::normal));
      double s = 0.0, q = 0.0;
      for (int64_t i = 0; i < p->numel(); ++i) {
        s += p->data[i];
        q += static_cast<double>(p->data[i]) * p->data[i];
      }
      double mean = s / p->numel(), sd = std::sqrt(q / p->numel() - mean * mean);
      double tol = 5.0 / std::sqrt(static_cast<double>(p->numel()));
      BOOST_TEST(std::fabs(mean) < tol, p->name << " mean " << mean);
      BOOST_TEST(std::fabs(sd - 1.0) < tol, p->name << " std " << sd);
    }
  }
  {
    LayerNorm ln("ln", 10);
    BoundParams b(ln, seed);
    check_const(ln.weight, ln.weight.data, 1.0f);
    check_const(ln.bias, ln.bias.data, 0.0f);
  }
  {
    const int64_t C = 64;
    MultiheadAttention attn("attn", C, 4);
    BoundParams b(attn, seed);
    check_uniform(attn.in_proj_weight, attn.in_proj_weight.data, std::sqrt(6.0 / (4.0 * C)));
    check_const(attn.in_proj_bias, attn.in_proj_bias.data, 0.0f);
    check_uniform(attn.out_proj.weight, attn.out_proj.weight.data, 1.0 / std::sqrt(static_cast<double>(C)));
    check_const(*attn.out_proj.bias, attn.out_proj.bias->data, 0.0f);
  }
  {
    auto m = make_mnist_cnn();
    BoundParams b(*m, seed);
    auto ps = m->params();
    check_uniform(*ps[0], ps[0]->data, 1.0 / 3.0);
    check_uniform(*ps[2], ps[2]->data, 1.0 / std::sqrt(288.0));
    check_uniform(*ps[4], ps[4]->data, 1.0 / 96.0);
    check_uniform(*ps[6], ps[6]->data, 1.0 / std::sqrt(128.0));
  }
}

BOOST_AUTO_TEST_CASE(init_depends_only_on_seed_name_index) {
  auto m = make_transformer(256, 32, 2, 4, 64, 16);
  FlatLayout layout = make_flat_layout(m->params());
  BOOST_TEST(layout.numel == m->num_params());
  BOOST_TEST(layout.offsets.front() == 0);
  for (size_t i = 1; i < layout.params.size(); ++i)
    BOOST_TEST(layout.offsets[i] == layout.offsets[i - 1] + layout.params[i - 1]->numel());
  std::vector<float> full(layout.numel);
  init_flat_range(layout, full.data(), 0, layout.numel, 42);
  std::mt19937 gen(1);
  std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 1}, {0, layout.numel}, {layout.numel - 1, layout.numel}, {layout.offsets[2] - 3, layout.offsets[5] + 7}};
  for (int i = 0; i < 30; ++i) {
    int64_t a = gen() % layout.numel, b = gen() % layout.numel;
    if (a > b) std::swap(a, b);
    ranges.push_back({a, b});
  }
  for (auto [a, b] : ranges) {
    std::vector<float> part(b - a + 1, -7.0f);
    init_flat_range(layout, part.data(), a, b, 42);
    for (int64_t i = a; i < b; ++i)
      BOOST_TEST_REQUIRE(part[i - a] == full[i], "range [" << a << "," << b << ") at " << i);
    BOOST_TEST(part[b - a] == -7.0f);  // nothing past the end written
  }
  // Padding past the last parameter (a sharded buffer's tail) is zero.
  std::vector<float> padded(20, 3.0f);
  init_flat_range(layout, padded.data(), layout.numel - 10, layout.numel + 10, 42);
  for (int i = 0; i < 10; ++i) BOOST_TEST(padded[i] == full[layout.numel - 10 + i]);
  for (int i = 10; i < 20; ++i) BOOST_TEST(padded[i] == 0.0f);
  // A second model with the same seed inits identically; another seed differs.
  auto m2 = make_transformer(256, 32, 2, 4, 64, 16);
  FlatLayout l2 = make_flat_layout(m2->params());
  std::vector<float> full2(l2.numel), full3(l2.numel);
  init_flat_range(l2, full2.data(), 0, l2.numel, 42);
  init_flat_range(l2, full3.data(), 0, l2.numel, 43);
  BOOST_TEST(full2 == full);
  BOOST_TEST(full3 != full);
  // The values belong to (seed, name, index): a standalone layer with the same name and shape
  // gets the same values as the model's.
  Linear head("head", 32, 256);
  BoundParams hb(head, 42);
  int64_t head_off = layout.offsets[layout.params.size() - 2];
  for (int64_t i = 0; i < head.weight.numel(); ++i) BOOST_TEST_REQUIRE(head.weight.data[i] == full[head_off + i]);
  // Param::init_values on a sub-range.
  const Param* w = layout.params[2];
  std::vector<float> sub(10);
  w->init_values(sub.data(), 5, 10, 42);
  for (int i = 0; i < 10; ++i) BOOST_TEST(sub[i] == full[layout.offsets[2] + 5 + i]);
}

BOOST_AUTO_TEST_CASE(bind_flat_points_into_buffers) {
  auto m = make_mnist_cnn();
  FlatLayout layout = make_flat_layout(m->params());
  std::vector<float> data(layout.numel), grad(layout.numel);
  bind_flat(layout, data.data(), grad.data());
  for (size_t i = 0; i < layout.params.size(); ++i) {
    BOOST_TEST(layout.params[i]->data == data.data() + layout.offsets[i]);
    BOOST_TEST(layout.params[i]->grad == grad.data() + layout.offsets[i]);
  }
  bind_flat(layout, data.data(), nullptr);
  for (Param* p : layout.params) BOOST_TEST(p->grad == nullptr);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
BOOST_AUTO_TEST_SUITE(whole_model)

namespace {
// FD on chosen flat coordinates of a model's loss.
void model_fd(Model& m, BoundParams& b, RunCtx& ctx, const Tensor& inputs, const Tensor& targets,
              const std::vector<int64_t>& coords, const Tol& tol, const std::string& what) {
  b.zero_grad();
  m.forward(ctx, inputs, targets);
  m.backward(ctx);
  std::vector<float> an = b.grad;
  auto label = [&](int64_t i) {
    const Param* p = b.param_of(i);
    return p ? p->name + "@" + std::to_string(i) : std::to_string(i);
  };
  double w = fd_check([&] { return m.forward(ctx, inputs, targets); }, b.data.data(), an, coords, tol, what, label);
  BOOST_TEST_MESSAGE(what << " worst " << w);
}
}  // namespace

BOOST_AUTO_TEST_CASE(mnist_cnn_gradient) {
  auto m = make_mnist_cnn();
  BoundParams b(*m, 3);
  RunCtx ctx;
  ctx.dropout = false;
  ctx.loss_normalizer = 2.0;
  // Two random images, normalised like Fashion-MNIST pixels.
  Tensor x = random_tensor({2, 1, 28, 28}, 30, -0.286f / 0.353f, (1.0f - 0.286f) / 0.353f);
  Tensor t = int_tensor({2}, {3, 7});
  // Per tensor: its 2 largest analytic gradients and 3 random coordinates (40 in all).
  b.zero_grad();
  m->forward(ctx, x, t);
  m->backward(ctx);
  std::mt19937 gen(2);
  std::vector<int64_t> coords;
  for (size_t i = 0; i < b.layout.params.size(); ++i) {
    int64_t off = b.layout.offsets[i], n = b.layout.params[i]->numel();
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), off);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int64_t a, int64_t c) { return std::fabs(b.grad[a]) > std::fabs(b.grad[c]); });
    coords.push_back(order[0]);
    coords.push_back(order[1]);
    for (int k = 0; k < 3; ++k) coords.push_back(off + static_cast<int64_t>(gen() % n));
  }
  std::sort(coords.begin(), coords.end());
  coords.erase(std::unique(coords.begin(), coords.end()), coords.end());
  // Float forward: the loss is quantised at ~1e-7 relative, so the step can't be tiny, and ReLU
  // and max-pool kinks make big steps wrong: 1e-3 first, then retries either side.
  model_fd(*m, b, ctx, x, t, coords, Tol{1e-3, 2e-4, 5e-2, {3e-4, 3e-3}}, "mnist");
  BOOST_TEST(m->output().shape() == (Shape{2, 10}));
}

BOOST_AUTO_TEST_CASE(tiny_transformer_gradient) {
  const int64_t V = 16, C = 8, S = 6, Bt = 2;
  auto m = make_transformer(V, C, 1, 2, 16, S);
  BoundParams b(*m, 4);
  RunCtx ctx;
  ctx.dropout = false;
  ctx.loss_normalizer = static_cast<double>(Bt * S);
  std::mt19937 gen(5);
  std::vector<int32_t> tok(Bt * S), tgt(Bt * S);
  for (auto& v : tok) v = static_cast<int32_t>(gen() % V);
  for (auto& v : tgt) v = static_cast<int32_t>(gen() % V);
  Tensor x = int_tensor({Bt, S}, tok), t = int_tensor({Bt, S}, tgt);
  // Every coordinate (936 of them) — the model is tiny.
  BOOST_TEST(b.layout.numel == 936);
  model_fd(*m, b, ctx, x, t, all_indices(b.layout.numel), Tol{1e-2, 3e-5, 3e-3}, "transformer");
  BOOST_TEST(m->output().shape() == (Shape{Bt, S, V}));
  // A shorter sequence than max also works (T = 4 < 6).
  Tensor x4 = int_tensor({1, 4}, {1, 2, 3, 4}), t4 = int_tensor({1, 4}, {2, 3, 4, 5});
  ctx.loss_normalizer = 4.0;
  std::vector<int64_t> some;
  for (int i = 0; i < 60; ++i) some.push_back(gen() % b.layout.numel);
  model_fd(*m, b, ctx, x4, t4, some, Tol{1e-2, 3e-5, 3e-3}, "transformer T=4");
}

BOOST_AUTO_TEST_CASE(split_batches_sum_to_full_batch) {
  // FSDP's invariant: two ranks' halves (sample_offset set, normalizer = global batch) add up to
  // the full batch, for the loss and for the gradients, with dropout on.
  auto m = make_mnist_cnn();
  BoundParams b(*m, 6);
  RunCtx ctx;
  ctx.seed = 9;
  ctx.step = 4;
  ctx.loss_normalizer = 4.0;
  Tensor x = random_tensor({4, 1, 28, 28}, 31, 0.0f, 1.0f);
  Tensor t = int_tensor({4}, {1, 2, 3, 4});
  double full = m->forward(ctx, x, t);
  m->backward(ctx);
  std::vector<float> g_full = b.grad;
  b.zero_grad();
  double parts = 0.0;
  for (int64_t start : {0, 2}) {
    Tensor xs = make_tensor({2, 1, 28, 28}, std::vector<float>(x.f32() + start * 784, x.f32() + (start + 2) * 784));
    Tensor ts = int_tensor({2}, {t.i32()[start], t.i32()[start + 1]});
    ctx.sample_offset = start;
    parts += m->forward(ctx, xs, ts);
    m->backward(ctx);  // accumulates
  }
  BOOST_TEST(std::fabs(parts - full) < 1e-5 * (1.0 + std::fabs(full)));
  double max_g = 0.0, max_err = 0.0;
  for (size_t i = 0; i < g_full.size(); ++i) {
    max_g = std::max(max_g, static_cast<double>(std::fabs(g_full[i])));
    max_err = std::max(max_err, static_cast<double>(std::fabs(g_full[i] - b.grad[i])));
  }
  BOOST_TEST(max_err < 1e-4 * max_g, "max err " << max_err << " max grad " << max_g);
}

BOOST_AUTO_TEST_CASE(activation_buffers_are_reused) {
  MemoryTracker mem;  // first: it outlives the model, whose activations it tracks until freed
  auto m = make_mnist_cnn();
  BoundParams b(*m, 7);
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.loss_normalizer = 2.0;
  Tensor x = random_tensor({2, 1, 28, 28}, 32, 0.0f, 1.0f);
  Tensor t = int_tensor({2}, {0, 9});
  double l1 = m->forward(ctx, x, t);
  m->backward(ctx);
  size_t after_first = mem.current_bytes(MemCategory::activations);
  size_t peak_first = mem.peak_bytes(MemCategory::activations);
  BOOST_TEST(after_first > 0u);
  BOOST_TEST(mem.current_total_bytes() == after_first);  // everything the layers own is activations
  double l2 = m->forward(ctx, x, t);
  m->backward(ctx);
  BOOST_TEST(mem.current_bytes(MemCategory::activations) == after_first);
  BOOST_TEST(mem.peak_bytes(MemCategory::activations) == peak_first);
  BOOST_TEST(l1 == l2);  // deterministic (same step, same seed)
}

BOOST_AUTO_TEST_CASE(empty_batch_on_a_rank) {
  // A short last eval batch split over ranks leaves some ranks no samples; they still run the
  // model (FSDP collectives need every rank) and must contribute zero loss and zero gradient.
  {
    Dropout d("d", 0.5f);
    Flatten f("f");
    RunCtx ctx;
    Tensor x = Tensor::empty({0, 3, 4}, DType::f32);
    BOOST_TEST(d.forward(ctx, x).shape() == x.shape());
    BOOST_TEST(f.forward(ctx, x).shape() == (Shape{0, 12}));
    BOOST_TEST(f.backward(ctx, f.forward(ctx, x)).shape() == x.shape());
  }
  auto run = [](Model& m, const Tensor& x, const Tensor& t, const Tensor& x1, const Tensor& t1) {
    BoundParams b(m, 2);
    RunCtx ctx;
    ctx.loss_normalizer = 8.0;
    BOOST_TEST(m.forward(ctx, x, t) == 0.0);
    m.backward(ctx);
    for (float g : b.grad) BOOST_TEST_REQUIRE(g == 0.0f);
    // The next, non-empty batch is unaffected.
    double l = m.forward(ctx, x1, t1);
    BOOST_TEST(std::isfinite(l));
    BOOST_TEST(l > 0.0);
    m.backward(ctx);
  };
  auto cnn = make_mnist_cnn();
  run(*cnn, Tensor::empty({0, 1, 28, 28}, DType::f32), Tensor::empty({0}, DType::i32),
      random_tensor({1, 1, 28, 28}, 40, 0.0f, 1.0f), int_tensor({1}, {4}));
  auto lm = make_transformer(16, 8, 1, 2, 16, 6);
  run(*lm, Tensor::empty({0, 6}, DType::i32), Tensor::empty({0, 6}, DType::i32), int_tensor({1, 6}, {1, 2, 3, 4, 5, 6}),
      int_tensor({1, 6}, {2, 3, 4, 5, 6, 7}));
}

// Hooks run around exactly the modules marked hooked (FSDP units' roots), at any depth, nested
// in the order forward and backward reach them.
BOOST_AUTO_TEST_CASE(hooks_see_the_hooked_modules_in_order) {
  struct Recorder : ModuleHooks {
    std::vector<std::string> events;
    void pre_forward(Module& m) override { events.push_back("pre_forward:" + m.name()); }
    void post_forward(Module& m) override { events.push_back("post_forward:" + m.name()); }
    void pre_backward(Module& m) override { events.push_back("pre_backward:" + m.name()); }
    void post_backward(Module& m) override { events.push_back("post_backward:" + m.name()); }
  };
  auto check = [](Model& m, const std::set<std::string>& hooked, const Tensor& x, const Tensor& t,
                  const std::vector<std::string>& forward, const std::vector<std::string>& backward) {
    BoundParams b(m, 1);
    m.visit([&](Module& mod) { mod.set_hooked(hooked.count(mod.name()) > 0 && !mod.is_container()); });
    Recorder rec;
    RunCtx ctx;
    ctx.hooks = &rec;
    double with_hooks = m.forward(ctx, x, t);
    BOOST_TEST(rec.events == forward, boost::test_tools::per_element());
    rec.events.clear();
    m.backward(ctx);
    BOOST_TEST(rec.events == backward, boost::test_tools::per_element());
    // Hooks don't change the result.
    ctx.hooks = nullptr;
    BOOST_TEST(m.forward(ctx, x, t) == with_hooks);
  };
  auto cnn = make_mnist_cnn();
  std::set<std::string> all{""};
  std::vector<std::string> fwd{"pre_forward:"}, bwd{"pre_backward:"};
  for (Layer* l : cnn->layers()) {
    all.insert(l->name());
    fwd.insert(fwd.end(), {"pre_forward:" + l->name(), "post_forward:" + l->name()});
  }
  for (size_t i = cnn->layers().size(); i-- > 0;) {
    const std::string& n = cnn->layers()[i]->name();
    bwd.insert(bwd.end(), {"pre_backward:" + n, "post_backward:" + n});
  }
  fwd.push_back("post_forward:");
  bwd.push_back("post_backward:");
  check(*cnn, all, random_tensor({2, 1, 28, 28}, 33, 0.0f, 1.0f), int_tensor({2}, {5, 6}), fwd, bwd);

  // The transformer: the embeddings inside their nameless holder, a block, and a module nested
  // in another block.
  auto lm = make_transformer(16, 8, 2, 2, 16, 6);
  check(*lm, {"", "tok_emb", "pos_emb", "blocks.0", "blocks.1.fc1", "head"}, int_tensor({1, 6}, {1, 2, 3, 4, 5, 6}),
        int_tensor({1, 6}, {2, 3, 4, 5, 6, 7}),
        {"pre_forward:", "pre_forward:tok_emb", "pre_forward:pos_emb", "post_forward:pos_emb", "post_forward:tok_emb",
         "pre_forward:blocks.0", "post_forward:blocks.0", "pre_forward:blocks.1.fc1", "post_forward:blocks.1.fc1",
         "pre_forward:head", "post_forward:head", "post_forward:"},
        {"pre_backward:", "pre_backward:head", "post_backward:head", "pre_backward:blocks.1.fc1",
         "post_backward:blocks.1.fc1", "pre_backward:blocks.0", "post_backward:blocks.0", "pre_backward:tok_emb",
         "pre_backward:pos_emb", "post_backward:pos_emb", "post_backward:tok_emb", "post_backward:"});
}

BOOST_AUTO_TEST_SUITE_END()

// fsdp.mixed_precision.compute: param_dtype: a layer's outputs and input gradients hold values
// rounded once to the compute dtype, and exactly the f32 pass's values so rounded where the op is
// one op in PyTorch; a norm's residual is added after its own dx is rounded (autograd's sum).
namespace {
bool all_bf16_values(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (ops::round_to_bf16(t.f32()[i]) != t.f32()[i]) return false;
  return true;
}
std::vector<float> rounded(const Tensor& t) {
  std::vector<float> v(t.f32(), t.f32() + t.numel());
  for (float& x : v) x = ops::round_to_bf16(x);
  return v;
}
std::vector<float> values(const Tensor& t) { return {t.f32(), t.f32() + t.numel()}; }
}  // namespace

// nn/activation_stash.h's protocol: what RunCtx::round recorded since the previous unit's end is
// packed at a unit's end except that unit's output (packed at the next end), and unpacked when
// that unit's backward begins; nothing is recorded outside a forward, released buffers are skipped,
// and f32 compute records nothing.
BOOST_AUTO_TEST_CASE(activation_stash_packs_between_unit_ends) {
  MemoryTracker mem;
  ActivationStash stash(DType::bf16);
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.compute_dtype = DType::bf16;
  ctx.stash = &stash;
  auto make = [&](float v) {
    Tensor t = Tensor::empty({4}, DType::f32, MemCategory::activations, &mem);
    for (int i = 0; i < 4; ++i) t.f32()[i] = v + static_cast<float>(i) / 3;  // rounded by round()
    return t;
  };
  auto packed = [](const Tensor& t) { return t.storage()->packed(); };
  auto held = [&] { return mem.current_bytes(MemCategory::activations); };
  stash.begin_forward();
  Tensor a = make(1), b = make(2), out1 = make(3), gone = make(4), stats = make(5);
  for (const Tensor* t : {&a, &b, &out1, &gone}) ctx.round(*t);
  const float a1 = a.f32()[1];  // bf16's nearest to 1 + 1/3
  gone = Tensor();              // released before the unit's end (a checkpointed unit's insides)
  stash.end_unit_forward(out1);
  BOOST_TEST(packed(a));
  BOOST_TEST(packed(b));
  BOOST_TEST(!packed(out1));   // unit 2's input: read at once
  BOOST_TEST(!packed(stats));  // never rounded: not recorded (not bf16 values)
  BOOST_TEST(stash.saved_bytes() == 16u);
  Tensor out2 = make(6);
  ctx.round(out2);
  stash.end_unit_forward(out2);
  BOOST_TEST(packed(out1));  // with unit 2's group
  BOOST_TEST(!packed(out2));
  BOOST_TEST(held() == 2 * 16u + 3 * 8u);  // stats out2 in f32, a b out1 in bf16
  stash.begin_backward();
  Tensor late = make(7);
  ctx.round(late);  // a recomputing forward in backward: not recorded
  stash.end_unit_forward(Tensor());
  BOOST_TEST(!packed(late));
  // The backward widens a buffer when it is first read, not before: the bf16 bits are there
  // for a reader that takes them as they are.
  BOOST_TEST(packed(a));
  BOOST_TEST(static_cast<const uint16_t*>(a.storage()->packed_data())[1] == f32_to_bf16(a1));
  BOOST_TEST((a.storage()->packed_dtype() == DType::bf16));
  BOOST_TEST(packed(a));
  BOOST_TEST(a.f32()[1] == a1);  // the rounded value, bit for bit
  BOOST_TEST(!packed(a));
  BOOST_TEST(a.storage()->packed_data() == nullptr);
  BOOST_TEST(packed(b));
  BOOST_TEST(packed(out1));
  b = Tensor();                        // freed by its last reader's backward without a read: never widened
  BOOST_TEST(held() == 4 * 16u + 8u);  // a stats out2 late in f32, out1 in bf16
  // f32 compute: round() neither rounds nor records.
  ctx.compute_dtype = DType::f32;
  stash.begin_forward();
  Tensor c = make(8);
  ctx.round(c);
  stash.end_unit_forward(Tensor());
  BOOST_TEST(!packed(c));
}

// At matmul_precision medium a Linear's backward takes its packed input's bf16 values as dW's
// operand as they are (Kernels::linear_backward_bf16_x): the input stays packed through the
// backward, never widened, and dW, db and dx are the bits the f32 input gives. At highest it
// widens the input first (same bits again).
BOOST_AUTO_TEST_CASE(linear_backward_reads_a_packed_input_in_bf16) {
  for (MatmulPrecision p : {MatmulPrecision::medium, MatmulPrecision::highest}) {
    BOOST_TEST_CONTEXT(matmul_precision_name(p)) {
      MemoryTracker mem;
      const std::unique_ptr<DeviceRuntime> rt = make_runtime(Device::cpu, mem, 0);
      rt->kernels().set_matmul_precision(p);
      std::vector<float> grads[2], dx[2];
      bool packed_after = false;
      for (int packed = 0; packed < 2; ++packed) {
        ActivationStash stash(DType::bf16);
        RunCtx ctx;
        ctx.mem = &mem;
        ctx.runtime = rt.get();
        ctx.compute_dtype = DType::bf16;
        ctx.training = true;
        if (packed) ctx.stash = &stash;
        Linear lin("l", 8, 5);
        BoundParams b(lin, 3);
        stash.begin_forward();
        const Tensor x = random_tensor({6, 8}, 21);
        ctx.round(x);  // a bf16 value each, recorded
        const Tensor y = lin.forward(ctx, x);
        stash.end_unit_forward(y);  // packs x
        BOOST_TEST(x.storage()->packed() == (packed == 1));
        stash.begin_backward();
        dx[packed] = values(lin.backward(ctx, random_tensor({6, 5}, 22)));
        grads[packed] = b.grad;
        if (packed) packed_after = x.storage()->packed();
      }
      BOOST_TEST(grads[0] == grads[1], boost::test_tools::per_element());
      BOOST_TEST(dx[0] == dx[1], boost::test_tools::per_element());
      BOOST_TEST(packed_after == (p == MatmulPrecision::medium));
    }
  }
}

BOOST_AUTO_TEST_CASE(compute_dtype_rounds_each_output_once) {
  RunCtx f32_ctx, bf16_ctx;
  bf16_ctx.compute_dtype = DType::bf16;
  const Tensor x = random_tensor({6, 8}, 11), dy = random_tensor({6, 8}, 12), res = random_tensor({6, 8}, 13);
  {
    Linear lin("l", 8, 8);
    BoundParams b(lin, 3);
    const Tensor y32 = lin.forward(f32_ctx, x).clone();
    const Tensor dx32 = lin.backward(f32_ctx, dy).clone();
    BOOST_TEST(!all_bf16_values(y32));  // so the checks below can fail
    BOOST_TEST(!all_bf16_values(dx32));
    BOOST_TEST(values(lin.forward(bf16_ctx, x)) == rounded(y32));
    BOOST_TEST(values(lin.backward(bf16_ctx, dy)) == rounded(dx32));
  }
  {
    GELU act("a");
    const Tensor y32 = act.forward(f32_ctx, x).clone();
    const Tensor dx32 = act.backward(f32_ctx, dy).clone();
    BOOST_TEST(values(act.forward(bf16_ctx, x)) == rounded(y32));
    BOOST_TEST(values(act.backward(bf16_ctx, dy)) == rounded(dx32));
  }
  {
    LayerNorm ln("n", 8);
    BoundParams b(ln, 5);
    b.perturb_constants(6);
    const Tensor y32 = ln.forward(f32_ctx, x).clone();
    const Tensor d32 = ln.backward(f32_ctx, dy).clone();  // no residual
    BOOST_TEST(values(ln.forward(bf16_ctx, x)) == rounded(y32));
    const Tensor dx = ln.backward_adding(bf16_ctx, dy, res);
    // round(round(d) + residual): the norm's rounded gradient, then autograd's rounded sum.
    std::vector<float> expect = rounded(d32);
    for (size_t i = 0; i < expect.size(); ++i) expect[i] = ops::round_to_bf16(expect[i] + res.f32()[i]);
    BOOST_TEST(values(dx) == expect);
  }
  {
    TransformerBlock blk("b", 8, 2, 16);
    BoundParams b(blk, 7);
    const Tensor x3 = random_tensor({2, 3, 8}, 14), dy3 = random_tensor({2, 3, 8}, 15);
    BOOST_TEST(!all_bf16_values(blk.forward(f32_ctx, x3)));
    BOOST_TEST(!all_bf16_values(blk.backward(f32_ctx, dy3)));
    BOOST_TEST(all_bf16_values(blk.forward(bf16_ctx, x3)));
    BOOST_TEST(all_bf16_values(blk.backward(bf16_ctx, dy3)));
  }
}

BOOST_AUTO_TEST_CASE(round_to_kernel) {
  Kernels& k = cpu_kernels();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {
      1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -2.5f, inf, -inf, 3.4e38f, 1e-40f, 0.0f};
  std::vector<float> b = v;
  k.round_to(b.data(), DType::bf16, static_cast<int64_t>(b.size()));
  for (size_t i = 0; i < v.size(); ++i) BOOST_TEST(b[i] == ops::round_to_bf16(v[i]));
  BOOST_TEST(b[0] == 1.0f);                         // a tie, to even
  BOOST_TEST(b[1] == 1.0f + std::ldexp(1.0f, -6));  // a tie, to even (up)
  std::vector<float> h = {65519.0f, 65520.0f, 1.0f + std::ldexp(1.0f, -11), std::ldexp(1.0f, -24), -0.1f};
  k.round_to(h.data(), DType::f16, static_cast<int64_t>(h.size()));
  BOOST_TEST(h[0] == 65504.0f);
  BOOST_TEST(h[1] == inf);  // overflow, as torch's .to(torch.float16)
  BOOST_TEST(h[2] == 1.0f);
  BOOST_TEST(h[3] == std::ldexp(1.0f, -24));  // the smallest subnormal
  BOOST_TEST(h[4] == -0.0999755859375f);
  std::vector<float> nan = {std::nanf("")};
  k.round_to(nan.data(), DType::bf16, 1);
  BOOST_TEST(std::isnan(nan[0]));
  std::vector<float> same = v;
  k.round_to(same.data(), DType::f32, static_cast<int64_t>(same.size()));
  BOOST_TEST(same == v);
  BOOST_CHECK_EXCEPTION(k.round_to(same.data(), DType::i32, 1), Error,
                        [](const Error& e) { return std::string(e.what()) == "round_to: i32 is not bf16 or f16"; });
}

// The loss from the logits (Kernels::cross_entropy_sum / cross_entropy_backward_logits): the bits
// of log_softmax_forward + nll_sum + cross_entropy_backward, ignored rows included, the gradient
// written over the logits.
BOOST_AUTO_TEST_CASE(cross_entropy_from_logits_same_bits) {
  Kernels& k = cpu_kernels();
  const int64_t rows = 37, C = 301;
  Tensor x = random_tensor({rows, C}, 21, -8.0f, 8.0f);
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = r % 5 == 3 ? -100 : static_cast<int32_t>((r * 53) % C);
  // Some rows' targets at their maximum, so the hit count is tested too.
  for (int64_t r = 0; r < rows; r += 4)
    if (t[r] >= 0) x.f32()[r * C + t[r]] = 9.0f;
  std::vector<float> logp(rows * C), d(rows * C), lse(rows);
  k.log_softmax_forward(logp.data(), x.f32(), rows, C);
  double s_ref = 0, s = 0;
  int64_t c_ref = 0, c = 0;
  k.nll_sum(logp.data(), t.data(), rows, C, &s_ref, &c_ref);
  k.cross_entropy_backward(d.data(), logp.data(), t.data(), rows, C, 0.25f);
  k.cross_entropy_sum(x.f32(), t.data(), rows, C, lse.data(), &s, &c);
  BOOST_TEST(s == s_ref);
  BOOST_TEST(c == c_ref);
  BOOST_TEST(c > 0);
  k.cross_entropy_backward_logits(x.f32(), x.f32(), lse.data(), t.data(), rows, C, 0.25f);
  BOOST_TEST(std::memcmp(x.f32(), d.data(), d.size() * sizeof(float)) == 0);
  for (int64_t j = 0; j < C; ++j) BOOST_TEST(x.f32()[3 * C + j] == 0.0f);  // an ignored row
}

// A block's residual add fused into its next norm (add_layernorm_forward, add_rmsnorm_forward):
// the bits of add, round, norm, round, in f32 and in bf16 compute; through a block, the same
// output, input gradient and parameter gradients as with the norm made a unit (unfused).
BOOST_AUTO_TEST_CASE(residual_add_fused_into_norm_same_bits) {
  Kernels& k = cpu_kernels();
  const int64_t rows = 9, C = 40;
  const Tensor x = random_tensor({rows, C}, 31, -3.0f, 3.0f), r = random_tensor({rows, C}, 32, -3.0f, 3.0f);
  const Tensor w = random_tensor({C}, 33), b = random_tensor({C}, 34);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<float> sum_ref(rows * C), y_ref(rows * C), m_ref(rows), s_ref(rows);
    k.add(sum_ref.data(), x.f32(), r.f32(), rows * C);
    k.round_to(sum_ref.data(), dt, rows * C);
    k.layernorm_forward(y_ref.data(), m_ref.data(), s_ref.data(), sum_ref.data(), w.f32(), b.f32(), rows, C, 1e-5f);
    k.round_to(y_ref.data(), dt, rows * C);
    std::vector<float> sum(rows * C), y(rows * C), m(rows), s(rows);
    k.add_layernorm_forward(sum.data(), y.data(), m.data(), s.data(), x.f32(), r.f32(), w.f32(), b.f32(), rows, C,
                            1e-5f, dt);
    BOOST_TEST(sum == sum_ref);
    BOOST_TEST(y == y_ref);
    BOOST_TEST(m == m_ref);
    BOOST_TEST(s == s_ref);
    k.rmsnorm_forward(y_ref.data(), s_ref.data(), sum_ref.data(), w.f32(), rows, C, 1e-6f);
    k.round_to(y_ref.data(), dt, rows * C);
    k.add_rmsnorm_forward(sum.data(), y.data(), s.data(), x.f32(), r.f32(), w.f32(), rows, C, 1e-6f, dt);
    BOOST_TEST(sum == sum_ref);
    BOOST_TEST(y == y_ref);
    BOOST_TEST(s == s_ref);
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    RunCtx ctx;
    ctx.compute_dtype = dt;
    const Tensor x3 = random_tensor({2, 5, 8}, 35), dy3 = random_tensor({2, 5, 8}, 36);
    std::vector<std::vector<float>> runs[2];
    for (int unfused = 0; unfused < 2; ++unfused) {
      TransformerBlock blk("b", 8, 2, 16);
      BoundParams p(blk, 7);
      p.perturb_constants(8);
      blk.ln2.set_hooked(unfused == 1);  // a unit of its own (no hooks in ctx): the plain add and forward
      runs[unfused].push_back(values(blk.forward(ctx, x3)));
      runs[unfused].push_back(values(blk.backward(ctx, dy3)));
      runs[unfused].push_back(p.grad);
    }
    BOOST_TEST(runs[0][0] == runs[1][0]);
    BOOST_TEST(runs[0][1] == runs[1][1]);
    BOOST_TEST(runs[0][2] == runs[1][2]);
  }
}

// Flash attention's arithmetic under compute: param_dtype (causal_softmax_flash, attention_rescale,
// causal_softmax_normalize): the row statistics are causal_softmax_forward's bit for bit, the
// stored exponentials are bf16 values within a bf16 rounding of the normalised P times the sum,
// and the recompute mode's forward equals the materialised one bitwise in bf16 too.
BOOST_AUTO_TEST_CASE(multihead_attention_flash_in_bf16) {
  Kernels& k = cpu_kernels();
  const int64_t planes = 3, T = 37;
  const CausalRows g = CausalRows::whole(planes, T);
  Tensor S = random_tensor({planes, T, T}, 41, -4.0f, 4.0f);
  std::vector<float> P(S.f32(), S.f32() + S.numel()), U = P;
  std::vector<float> mx(planes * T), inv(planes * T), umx(planes * T), uinv(planes * T);
  k.causal_softmax_forward(P.data(), g, mx.data(), inv.data());
  k.causal_softmax_flash(U.data(), g, umx.data(), uinv.data(), DType::bf16);
  BOOST_TEST(umx == mx);
  BOOST_TEST(uinv == inv);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        const float u = U[(p * T + i) * T + j];
        if (j > i) {
          BOOST_TEST_REQUIRE(u == 0.0f);
          continue;
        }
        BOOST_TEST_REQUIRE(ops::round_to_bf16(u) == u);
        const float e = P[(p * T + i) * T + j] / inv[p * T + i];  // the unrounded exponential, nearly
        BOOST_TEST_REQUIRE(std::fabs(u - e) <= std::ldexp(std::fabs(e), -8));
      }
  std::vector<float> N = U;
  k.causal_softmax_normalize(N.data(), g, inv.data(), DType::f32);
  for (size_t n = 0; n < N.size(); ++n) BOOST_TEST_REQUIRE(std::fabs(N[n] - P[n]) <= std::ldexp(P[n], -8));
  k.causal_softmax_normalize(U.data(), g, inv.data(), DType::bf16);
  for (size_t n = 0; n < N.size(); ++n) BOOST_TEST_REQUIRE(U[n] == ops::round_to_bf16(N[n]));
  {
    // attention_rescale: head h of row t times inv[(b * H + h) * stride + t], rounded.
    const int64_t B = 2, Tq = 3, H = 2, hd = 4, stride = 5;
    Tensor y = random_tensor({B, Tq, H * hd}, 42), r = random_tensor({B * H * stride}, 43, 0.5f, 2.0f);
    std::vector<float> want(y.f32(), y.f32() + y.numel());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tq; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < hd; ++d) {
            float& w = want[(b * Tq + t) * H * hd + h * hd + d];
            w = ops::round_to_bf16(w * r.f32()[(b * H + h) * stride + t]);
          }
    k.attention_rescale(y.f32(), r.f32(), B, Tq, H, hd, stride, DType::bf16);
    BOOST_TEST(values(y) == want);
  }
  // Through the layer: recompute's forward is the materialised one's bits; the backward within a
  // bf16 rounding (the materialised dS uses P from the rounded exponentials, recompute's the exact).
  RunCtx f32_ctx, ctx;
  ctx.compute_dtype = DType::bf16;
  MultiheadAttention mat("attn", 8, 2), rec("attn", 8, 2, AttentionMode::recompute);
  BoundParams bm(mat, 6), br(rec, 6);
  bm.perturb_constants(7);
  br.perturb_constants(7);
  for (const int64_t Tl : {int64_t{5}, int64_t{70}}) {
    BOOST_TEST_CONTEXT("T " << Tl) {
      Tensor x = random_tensor({2, Tl, 8}, 44), dy = random_tensor({2, Tl, 8}, 45);
      const std::vector<float> y32 = to_vec(mat.forward(f32_ctx, x));
      const std::vector<float> ym = to_vec(mat.forward(ctx, x)), yr = to_vec(rec.forward(ctx, x));
      BOOST_TEST(ym == yr);
      BOOST_TEST(ym != y32);
      float scale = 0.0f;
      for (float v : y32) scale = std::max(scale, std::fabs(v));
      for (size_t i = 0; i < ym.size(); ++i) BOOST_TEST_REQUIRE(std::fabs(ym[i] - y32[i]) <= 0.03f * scale);
      const std::vector<float> dxm = to_vec(mat.backward(ctx, dy)), dxr = to_vec(rec.backward(ctx, dy));
      float dscale = 0.0f;
      for (float v : dxm) dscale = std::max(dscale, std::fabs(v));
      for (size_t i = 0; i < dxm.size(); ++i) BOOST_TEST_REQUIRE(std::fabs(dxm[i] - dxr[i]) <= 0.03f * dscale);
    }
  }
}
