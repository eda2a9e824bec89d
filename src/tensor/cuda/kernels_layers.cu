// CudaKernels' Linear and conv helpers (bias rows, column sums, im2col/col2im, the conv permutes), pooling and
// embeddings (launch.h; kernels_common.cuh: what they share).
#include "tensor/cuda/kernels_common.cuh"

namespace fsdp::cuda::launch {
namespace {

// ---- Linear / conv helpers.
// Y[r, :] = b, a block row of columns per grid row (no per-element index division).
__global__ void bias_rows_k(float* Y, const float* b, int64_t rows, int64_t out) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float* yr = Y + r * out;
    for (int64_t c = gtid(); c < out; c += gstride()) yr[c] = b[c];
  }
}
// db[c] += sum over r of dY[r, c].
__global__ void col_sum_add_k(float* db, const float* dY, int64_t rows, int64_t out) {
  const int64_t c = tile_column();
  float acc = 0.0f;
  if (c < out) {
#pragma unroll 4
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += dY[r * out + c];
  }
  acc = sum_row_lanes(acc);
  if (threadIdx.y == 0 && c < out) db[c] += acc;
}
__global__ void im2col_k(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
                         int64_t OH, int64_t OW) {
  const int64_t P = OH * OW, ld = B * P, total = C * K * K * ld;
  for (int64_t i = gtid(); i < total; i += gstride()) {
    int64_t row = i / ld, colj = i % ld;
    int64_t b = colj / P, p = colj % P, oh = p / OW, ow = p % OW;
    int64_t kw = row % K, kh = (row / K) % K, c = row / (K * K);
    int64_t ih = oh + kh - pad, iw = ow + kw - pad;
    col[i] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((b * C + c) * H + ih) * W + iw] : 0.0f;
  }
}
// Gather form of col2im: each dx element sums its column entries (no atomics; overwrites dx).
__global__ void col2im_k(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t pad, int64_t OH, int64_t OW) {
  const int64_t P = OH * OW, ld = B * P, total = B * C * H * W;
  for (int64_t i = gtid(); i < total; i += gstride()) {
    int64_t iw = i % W, ih = (i / W) % H, c = (i / (W * H)) % C, b = i / (W * H * C);
    float acc = 0.0f;
    for (int64_t kh = 0; kh < K; ++kh) {
      int64_t oh = ih - kh + pad;
      if (oh < 0 || oh >= OH) continue;
      for (int64_t kw = 0; kw < K; ++kw) {
        int64_t ow = iw - kw + pad;
        if (ow < 0 || ow >= OW) continue;
        acc += dcol[((c * K + kh) * K + kw) * ld + b * P + oh * OW + ow];
      }
    }
    dx[i] = acc;
  }
}
__global__ void conv_bias_permute_k(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) {
  for (int64_t i = gtid(); i < B * out * P; i += gstride()) {
    int64_t p = i % P, o = (i / P) % out, b = i / (P * out);
    y[i] = ybuf[o * B * P + b * P + p] + bias[o];
  }
}
__global__ void conv_permute_k(float* dyt, const float* dy, int64_t B, int64_t out, int64_t P) {
  for (int64_t i = gtid(); i < B * out * P; i += gstride()) {
    int64_t p = i % P, o = (i / P) % out, b = i / (P * out);
    dyt[o * B * P + b * P + p] = dy[i];
  }
}
// db[o] += sum of row o of dyt (out, B*P): one block per o.
__global__ void row_sum_add_k(float* db, const float* dyt, int64_t cols) {
  const float* row = dyt + static_cast<int64_t>(blockIdx.x) * cols;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += row[j];
  acc = block_reduce(acc, Sum{});
  if (threadIdx.x == 0) db[blockIdx.x] += acc;
}

// ---- Pooling and embeddings.
__global__ void maxpool2_forward_k(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) {
  const int64_t OH = H / 2, OW = W / 2;
  for (int64_t i = gtid(); i < planes * OH * OW; i += gstride()) {
    int64_t ow = i % OW, oh = (i / OW) % OH, p = i / (OW * OH);
    const float* xp = x + p * H * W;
    int64_t best = (2 * oh) * W + 2 * ow;
    const int64_t cand[3] = {best + 1, best + W, best + W + 1};
    for (int64_t k : cand) {
      if (xp[k] > xp[best] || isnan(xp[k])) best = k;
    }
    y[i] = xp[best];
    argmax[i] = static_cast<int32_t>(best);
  }
}
// Windows do not overlap: each dx element gets at most one dy, so a scatter after a zero fill.
__global__ void maxpool2_backward_k(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                                    int64_t W) {
  const int64_t OH = H / 2, OW = W / 2;
  for (int64_t i = gtid(); i < planes * OH * OW; i += gstride()) {
    int64_t p = i / (OH * OW);
    dx[p * H * W + argmax[i]] += dy[i];
  }
}
// One thread per rotated pair: (rows, heads, D/2).
__global__ void rope_k(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D,
                       int64_t ld, int64_t pos0, bool backward) {
  const int64_t half = D / 2, n = rows * heads * half;
  for (int64_t k = gtid(); k < n; k += gstride()) {
    const int64_t i = k % half, h = (k / half) % heads, r = k / (half * heads);
    const int64_t at = (pos0 + r % T) * half + i;
    float* head = x + r * ld + h * D;
    kmath::rope_pair(head + i, head + half + i, cos[at], backward ? -sin[at] : sin[at]);
  }
}
__global__ void embedding_forward_k(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                                    int64_t T, int64_t C) {
  for (int64_t i = gtid(); i < B * T * C; i += gstride()) {
    int64_t c = i % C, bt = i / C, t = bt % T;
    const float te = wte[static_cast<int64_t>(tokens[bt]) * C + c];
    y[i] = wpe ? te + wpe[t * C + c] : te;  // wpe null: no position term (T5)
  }
}
__global__ void embedding_backward_k(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                                     int64_t T, int64_t C) {
  for (int64_t i = gtid(); i < B * T * C; i += gstride()) {
    int64_t c = i % C, bt = i / C, t = bt % T;
    if (tokens[bt] < 0) continue;  // nn.Embedding's padding_idx: no gradient (kernels.h)
    atomicAdd(&dwte[static_cast<int64_t>(tokens[bt]) * C + c], dy[i]);
    if (dwpe) atomicAdd(&dwpe[t * C + c], dy[i]);
  }
}

}  // namespace

void bias_rows(float* Y, const float* b, int64_t rows, int64_t out, cudaStream_t s) {
  if (rows * out == 0) return;
  const int64_t col_blocks = (out + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(col_blocks < 8 ? col_blocks : 8),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  bias_rows_k<<<grid, kThreads, 0, s>>>(Y, b, rows, out);
  check_launch("bias_rows");
}
void col_sum_add(float* db, const float* dY, int64_t rows, int64_t out, cudaStream_t s) {
  if (out == 0) return;
  col_sum_add_k<<<column_tiles(out), dim3(kColTile, kRowLanes), 0, s>>>(db, dY, rows, out);
  check_launch("col_sum_add");
}
void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad, int64_t OH,
            int64_t OW, cudaStream_t s) {
  int64_t n = C * K * K * B * OH * OW;
  if (n == 0) return;
  im2col_k<<<blocks_for(n), kThreads, 0, s>>>(x, col, B, C, H, W, K, pad, OH, OW);
  check_launch("im2col");
}
void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
            int64_t OH, int64_t OW, cudaStream_t s) {
  int64_t n = B * C * H * W;
  if (n == 0) return;
  col2im_k<<<blocks_for(n), kThreads, 0, s>>>(dcol, dx, B, C, H, W, K, pad, OH, OW);
  check_launch("col2im");
}
void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P,
                       cudaStream_t s) {
  if (B * out * P == 0) return;
  conv_bias_permute_k<<<blocks_for(B * out * P), kThreads, 0, s>>>(y, ybuf, bias, B, out, P);
  check_launch("conv_bias_permute");
}
void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P, cudaStream_t s) {
  if (B * out * P == 0) return;
  conv_permute_k<<<blocks_for(B * out * P), kThreads, 0, s>>>(dyt, dy, B, out, P);
  check_launch("conv_grad_permute");
  row_sum_add_k<<<rows_grid(out, "conv_grad_permute"), kThreads, 0, s>>>(db, dyt, B * P);
  check_launch("conv_grad_permute (bias sums)");
}

void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W, cudaStream_t s) {
  int64_t n = planes * (H / 2) * (W / 2);
  if (n == 0) return;
  maxpool2_forward_k<<<blocks_for(n), kThreads, 0, s>>>(y, argmax, x, planes, H, W);
  check_launch("maxpool2_forward");
}
void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H, int64_t W,
                       cudaStream_t s) {
  if (planes * H * W == 0) return;
  fill(dx, 0.0f, planes * H * W, s);
  int64_t n = planes * (H / 2) * (W / 2);
  if (n == 0) return;
  maxpool2_backward_k<<<blocks_for(n), kThreads, 0, s>>>(dx, dy, argmax, planes, H, W);
  check_launch("maxpool2_backward");
}
void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D, int64_t ld,
          int64_t pos0, bool backward, cudaStream_t s) {
  const int64_t n = rows * heads * (D / 2);
  if (n == 0) return;
  rope_k<<<blocks_for(n), kThreads, 0, s>>>(x, cos, sin, rows, T, heads, D, ld, pos0, backward);
  check_launch("rope");
}
void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, cudaStream_t s) {
  if (B * T * C == 0) return;
  embedding_forward_k<<<blocks_for(B * T * C), kThreads, 0, s>>>(y, tokens, wte, wpe, B, T, C);
  check_launch("embedding_forward");
}
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, cudaStream_t s) {
  if (B * T * C == 0) return;
  embedding_backward_k<<<blocks_for(B * T * C), kThreads, 0, s>>>(dwte, dwpe, dy, tokens, B, T, C);
  check_launch("embedding_backward");
}

}  // namespace fsdp::cuda::launch
