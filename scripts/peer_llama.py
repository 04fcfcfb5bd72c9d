"""The Llama-family decoder of scripts/peer_gpt.py, as `meshtensor train --model llama:...` builds
it: RMSNorm, rotary embeddings (rotate-half), grouped-query attention, a SwiGLU MLP, no biases,
optionally an RMSNorm of each head's queries and keys (Qwen3); meshtensor's initialisation."""
import math

import torch
import torch.nn as nn

VOCABULARY = 256


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn, norm_eps, qk_norm):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1 = RMSNorm(dim, norm_eps)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.norm2 = RMSNorm(dim, norm_eps)
        self.gate_up = nn.Linear(dim, 2 * ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        a = self.norm1(x)
        q = self.q_norm(self.q(a).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k, v = self.kv(a).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = self.k_norm(k).transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        attended = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down_proj(nn.functional.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, layers, heads, kv_heads, dim, ffn, context, rope_theta, norm_eps,
                 qk_norm=0, **_):
        super().__init__()
        self.token = nn.Embedding(VOCABULARY, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, ffn, norm_eps, qk_norm)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim, norm_eps)
        self.head = nn.Linear(dim, VOCABULARY, bias=False)
        head_dim = dim // heads
        inverse = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(context, dtype=torch.float64), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float())
        self.register_buffer("sin", angles.sin().float())
        # A plain attribute, not a buffer: Gloo cannot broadcast bool tensors (DDP syncs buffers).
        self.mask = torch.tril(torch.ones(context, context, dtype=torch.bool))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual = name.endswith(("proj.weight", "down_proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.token(tokens)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t], self.mask[:t, :t])
        return self.head(self.norm(x))
