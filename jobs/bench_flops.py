"""FLOPs per training step of the two seed models and the bench Llama, and the measured sgemm
peak, shared by the benchmarks that report a fraction of the sgemm peak (jobs/bench-core.sh,
jobs/bench_peer_report.py).

Counted as model FLOPs: 2 per multiply-add of every matmul (convolutions as their im2col GEMM),
forward once and backward twice (input and weight gradients); element-wise work is left out.
"""
import re

# input/transformer_bench.yaml's model.
BENCH_TRANSFORMER = dict(vocab=256, d_model=512, n_layers=8, n_heads=8, d_ff=2048, seq_len=256)


def transformer_matmul_params(vocab, d_model, n_layers, d_ff, **_):
    """Parameters that take part in matmuls: in_proj, out_proj, fc1, fc2 per layer; the head."""
    C, L, F, V = d_model, n_layers, d_ff, vocab
    return L * (3 * C * C + C * C + 2 * C * F) + C * V


def transformer_step_flops(batch, vocab, d_model, n_layers, d_ff, seq_len, **_):
    """6 * (matmul parameters) * tokens, plus attention 12 * L * B * T^2 * C (QK^T and PV,
    forward 4BT^2C + backward 8BT^2C per layer), counted over the full T x T although the causal
    half is masked: PaLM's model-FLOPs convention, and what PyTorch's nn.MultiheadAttention
    computes. fsdp-hpc's host kernels skip most of the masked half (Kernels::causal_row_block:
    row blocks of 32, so (n + 1) / 2n of the square for n = T / 32 blocks), so they execute fewer
    FLOPs than counted; transformer_executed_step_flops gives that number."""
    B, T, C, L = batch, seq_len, d_model, n_layers
    return 6 * transformer_matmul_params(vocab, d_model, n_layers, d_ff) * B * T + 12 * L * B * T * T * C


def causal_covered(T, row_block=32):
    """The (query, key) pairs of a T x T score plane that fsdp-hpc's host kernels compute: per row
    block [r0, r1), only the key columns < r1 (Kernels::causal_row_block; nn/attention.cpp and
    models/llama/llama.cpp)."""
    blocks = -(-T // row_block)
    return sum(min(T, (i + 1) * row_block) * (min(T, (i + 1) * row_block) - i * row_block) for i in range(blocks))


def transformer_executed_step_flops(batch, vocab, d_model, n_layers, d_ff, seq_len, row_block=32, **_):
    """The matmul FLOPs fsdp-hpc's host kernels execute per step (causal_covered)."""
    B, T, C, L = batch, seq_len, d_model, n_layers
    return 6 * transformer_matmul_params(vocab, d_model, n_layers, d_ff) * B * T + \
        12 * L * B * causal_covered(T, row_block) * C


# input/llama_bench.yaml's model (jobs/bench-peer.sh --models llama).
BENCH_LLAMA = dict(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, seq_len=256)


def llama_step_flops(batch, vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
                     num_key_value_heads, seq_len, executed=False, **_):
    """As transformer_step_flops: 6 * (matmul parameters) * tokens with q_proj and o_proj (C x C),
    k_proj and v_proj (C x G*D, grouped-query), gate, up and down (C x I) per layer and lm_head,
    plus attention 12 * L * B * T^2 * C over the full T x T (the query heads' QK^T and PV; the
    key/value heads they share do not cut it). With executed=True, the attention term over the
    pairs fsdp-hpc's host kernels compute (causal_covered) instead of T x T."""
    B, T, C, L, I, V = batch, seq_len, hidden_size, num_hidden_layers, intermediate_size, vocab_size
    kv = num_key_value_heads * (C // num_attention_heads)
    params = L * (2 * C * C + 2 * C * kv + 3 * C * I) + C * V
    return 6 * params * B * T + 12 * L * B * (causal_covered(T) if executed else T * T) * C


def mnist_cnn_step_flops(batch):
    """The PyTorch MNIST example's Net on 28x28 images: conv1 (1->32, 3x3), conv2 (32->64, 3x3),
    fc1 (9216->128), fc2 (128->10). conv1 needs no input gradient, so it counts twice, not 3x."""
    conv1 = 26 * 26 * 32 * (1 * 9)
    conv2 = 24 * 24 * 64 * (32 * 9)
    fc1, fc2 = 9216 * 128, 128 * 10
    macs_3x = conv2 + fc1 + fc2
    return batch * 2 * (3 * macs_3x + 2 * conv1)


def sgemm_peak_gflops(text):
    """The best GFLOP/s from apps/sgemm_peak's output line."""
    m = re.search(r"best ([0-9.]+) GFLOP/s", text)
    if not m:
        raise SystemExit(f"no 'best ... GFLOP/s' in sgemm_peak's output: {text.strip()[:200]}")
    return float(m.group(1))
