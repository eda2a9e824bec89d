"""torch.nn twins of fsdp-hpc's two seed models (src/models/model.cpp) and of its Llama
(src/models/llama/, model.kind: llama).

The state_dict names, their order and shapes are identical to our parameters' names, so
`model.state_dict()` written as /model/<name> in an HDF5 file is what `model.init_from` loads.

- Net: the PyTorch MNIST example's network (mnist_cnn).
- LM: the decoder-only byte-level transformer (transformer): tok_emb + pos_emb, pre-norm blocks
  (ln1, causal MultiheadAttention, ln2, fc1, GELU, fc2), ln_f, head; cross-entropy over every
  position.
- Llama: transformers 4.36's LlamaForCausalLM in plain torch (jobs/bench-peer.sh's PyTorch 2.x
  venv has no transformers): its parameter names, RMSNorm, rotary embeddings, grouped-query
  attention, SwiGLU MLP, optionally tied head; cross-entropy over every position.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """The PyTorch MNIST example's Net (examples/mnist/main.py)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)

    @staticmethod
    def loss(output, target):
        return F.nll_loss(output, target)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(ln1(x)), then x + fc2(gelu(fc1(ln2(x))))."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class LM(nn.Module):
    """Decoder-only LM: tokens (B, T) int64 -> logits (B, T, vocab)."""

    def __init__(self, vocab, d_model, n_layers, n_heads, d_ff, seq_len):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads, d_ff) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        # Float causal mask: -inf above the diagonal (position t attends to 0..t).
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)  # not in the state_dict

    def forward(self, tokens):
        T = tokens.shape[1]
        pos = torch.arange(T, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        mask = self.causal_mask[:T, :T]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))

    @staticmethod
    def loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class LlamaRMSNorm(nn.Module):
    """HF's LlamaRMSNorm: w * x / sqrt(mean(x^2) + eps), in float32."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    """HF's LlamaSdpaAttention (its default attention since 4.36 on torch >= 2.1.1): q, k rotated,
    each key/value head repeated for its num_heads / num_kv_heads query heads (HF's repeat_kv),
    then F.scaled_dot_product_attention with the causal mask, scale 1/sqrt(head_dim)."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, bias):
        super().__init__()
        self.H, self.G, self.D = num_heads, num_kv_heads, hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, self.H * self.D, bias=bias)
        self.k_proj = nn.Linear(hidden_size, self.G * self.D, bias=bias)
        self.v_proj = nn.Linear(hidden_size, self.G * self.D, bias=bias)
        self.o_proj = nn.Linear(self.H * self.D, hidden_size, bias=bias)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(B, T, self.G, self.D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.G, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.G != self.H:
            k = k.repeat_interleave(self.H // self.G, dim=1)
            v = v.repeat_interleave(self.H // self.G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.D))


class LlamaMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)); registered in
    HF's order (self_attn, mlp, the norms)."""

    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                                        c["attention_bias"])
        self.mlp = LlamaMLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([LlamaDecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])


LLAMA_DEFAULTS = dict(rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, tie_word_embeddings=False,
                      initializer_range=0.02)  # HF's LlamaConfig defaults, as model.kind llama's


class Llama(nn.Module):
    """LlamaForCausalLM: tokens (B, T) int64 -> logits (B, T, vocab). Keys: HF's LlamaConfig names
    (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, and LLAMA_DEFAULTS' keys), plus seq_len (the rotary tables' length)."""

    def __init__(self, seq_len, **config):
        super().__init__()
        c = dict(LLAMA_DEFAULTS, **config)
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:  # one Parameter under both names, as HF ties it
            self.lm_head.weight = self.model.embed_tokens.weight
        # HF's _init_weights: every Linear and the embedding N(0, initializer_range), biases zero
        # (the norms start at one).
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=c["initializer_range"])
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        # HF's LlamaRotaryEmbedding in float32: inv_freq = 1 / theta^(2i/D), angles t * inv_freq,
        # both halves of a head the same angle (rotate_half pairs i with i + D/2). Not in the
        # state_dict (HF's buffers are not persistent either).
        D = c["hidden_size"] // c["num_attention_heads"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2).float() / D))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    @staticmethod
    def loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
