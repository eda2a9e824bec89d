"""torch.nn twins of fsdp-hpc's two seed models (src/models/model.cpp).

The state_dict names, their order and shapes are identical to our parameters' names, so
`model.state_dict()` written as /model/<name> in an HDF5 file is what `model.init_from` loads.

- Net: the PyTorch MNIST example's network (mnist_cnn).
- LM: the decoder-only byte-level transformer (transformer): tok_emb + pos_emb, pre-norm blocks
  (ln1, causal MultiheadAttention, ln2, fc1, GELU, fc2), ln_f, head; cross-entropy over every
  position.
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
