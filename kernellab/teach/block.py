"""A small pre-norm transformer block whose softmax, norms or attention can be kernellab ops: where the tutorials'
kernels (03 softmax, 04 LayerNorm and RMSNorm, 07 attention) meet a model, torch.compile(fullgraph=True) and a
comparison with the same block in plain PyTorch."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class TransformerBlock(nn.Module):
    """x + attention(norm(x)), then + MLP(norm(.)): x is [batch, tokens, d_model].

    norm: "layernorm" or "rmsnorm". The parts PyTorch does by default can each be an op:
    norm_op(x2d, weight, bias, eps) for LayerNorm or norm_op(x2d, weight, eps) for RMSNorm, on [rows, d_model];
    softmax_op(scores2d) on [rows, tokens] (attention written out: scores, mask, softmax, @ v);
    attention_op(q, k, v, causal) on contiguous [batch, heads, tokens, head_dim];
    add_norm_op(x2d, r2d, weight, bias, eps) -> (x2d + r2d, LayerNorm(x2d + r2d) in r2d's dtype) on [rows, d_model]
    (LayerNorm only; kernellab.teach.add_norm's kl_add_layernorm, or its reference_add_layernorm): the residual add
    before the second norm goes through it with that norm, and residual_step leaves the MLP's add to the caller (a
    GPT fuses it with the next block's first norm). The first norm stays norm_op's (or PyTorch's).
    Without attention_op and softmax_op the attention is F.scaled_dot_product_attention; with softmax_op, or with
    attention="explicit", it is written out (the reference of a block whose softmax is an op)."""

    def __init__(self, d_model: int = 512, n_heads: int = 8, *, norm: str = "layernorm", causal: bool = True,
                 mlp_ratio: int = 4, attention: str = "sdpa", norm_op=None, softmax_op=None, attention_op=None,
                 add_norm_op=None, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        if norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm is 'layernorm' or 'rmsnorm', got {norm!r}")
        if attention not in ("sdpa", "explicit"):
            raise ValueError(f"attention is 'sdpa' or 'explicit', got {attention!r}")
        if add_norm_op is not None and norm != "layernorm":
            raise ValueError("add_norm_op fuses the residual add with LayerNorm: it needs norm='layernorm'")
        if d_model % n_heads:
            raise ValueError(f"d_model = {d_model} is not a multiple of n_heads = {n_heads}")
        kw = dict(device=device, dtype=dtype)
        self.d_model, self.n_heads, self.norm, self.causal, self.eps = d_model, n_heads, norm, causal, eps
        self.attention = "explicit" if softmax_op is not None else attention
        self.norm_op, self.softmax_op, self.attention_op = norm_op, softmax_op, attention_op
        self.add_norm_op = add_norm_op
        self.norm1_w, self.norm2_w = nn.Parameter(torch.ones(d_model, **kw)), nn.Parameter(torch.ones(d_model, **kw))
        self.norm1_b = nn.Parameter(torch.zeros(d_model, **kw)) if norm == "layernorm" else None
        self.norm2_b = nn.Parameter(torch.zeros(d_model, **kw)) if norm == "layernorm" else None
        self.qkv = nn.Linear(d_model, 3 * d_model, **kw)
        self.proj = nn.Linear(d_model, d_model, **kw)
        self.up = nn.Linear(d_model, mlp_ratio * d_model, **kw)
        self.down = nn.Linear(mlp_ratio * d_model, d_model, **kw)

    def _norm(self, x, w, b):
        """LayerNorm or RMSNorm over the last dimension: the op on [rows, d_model], or PyTorch's."""
        if self.norm_op is not None:
            flat = x.reshape(-1, self.d_model)                                    # [B*N, D]
            y = self.norm_op(flat, w, b, self.eps) if b is not None else self.norm_op(flat, w, self.eps)
            return y.view(x.shape)
        if b is not None:
            return F.layer_norm(x, (self.d_model,), w, b, self.eps)
        return F.rms_norm(x, (self.d_model,), w, self.eps)

    def _attend(self, q, k, v):
        """softmax(q k^T / sqrt(d), causal) v for [B, H, N, d]."""
        if self.attention_op is not None:
            return self.attention_op(q, k, v, self.causal)
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        n = q.shape[-2]
        s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)                       # [B, H, N, N]
        if self.causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        if self.softmax_op is not None:
            p = self.softmax_op(s.reshape(-1, n)).view(s.shape)
        else:
            p = torch.softmax(s, dim=-1)
        return p @ v

    def add_norm(self, x, r, w, b):
        """(x + r, LayerNorm(x + r) in r's dtype) by add_norm_op on [rows, d_model], in x's shape."""
        h, y = self.add_norm_op(x.reshape(-1, self.d_model), r.reshape(-1, self.d_model), w, b, self.eps)
        return h.view(x.shape), y.view(x.shape)

    def _attention_branch(self, h):
        """proj(attention(qkv(h))): the branch added to the stream, [B, N, D]."""
        B, N, D = h.shape
        H = self.n_heads
        qkv = self.qkv(h).view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)          # [3, B, H, N, d]
        q, k, v = (t.contiguous() for t in qkv)
        o = self._attend(q, k, v).transpose(1, 2).reshape(B, N, D)                # [B, N, D]
        return self.proj(o)

    def residual_step(self, x, h):
        """With add_norm_op, the block but its last add: x the stream, h its first norm (norm1(x)); returns
        (the stream after the attention's add, the MLP's branch not yet added to it)."""
        x, h = self.add_norm(x, self._attention_branch(h), self.norm2_w, self.norm2_b)
        return x, self.down(F.gelu(self.up(h)))

    def forward(self, x):
        h = self._norm(x, self.norm1_w, self.norm1_b)
        if self.add_norm_op is not None:
            x, m = self.residual_step(x, h)
            return x + m
        x = x + self._attention_branch(h)
        h = self._norm(x, self.norm2_w, self.norm2_b)
        return x + self.down(F.gelu(self.up(h)))


def max_errors(ours, reference, want) -> tuple[float, float]:
    """(max |ours - want|, max |reference - want|): an output's error and PyTorch's own, against a float64 `want`."""
    want = want.double()
    return (float((ours.double() - want).abs().max()), float((reference.double() - want).abs().max()))


def do_bench_ratios(result, x, ours, eager, compiled) -> str:
    """Ours against the eager and compiled PyTorch blocks on `x` by triton's do_bench, beside kernellab.bench's."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return "triton is not installed: kernellab.bench's figures above are the only ones"
    block_ms = {name: do_bench(lambda f=f: f(x), return_mode="median")
                for name, f in (("ours", ours), ("eager", eager), ("compiled", compiled))}
    return "\n".join(f"vs the PyTorch block ({base}): {block_ms[base] / block_ms['ours']:.2f}x by do_bench, "
                     f"{result.speedup(baseline).ratio:.2f}x by kernellab.bench"
                     for base, baseline in (("eager", "PyTorch block"), ("compiled", "PyTorch block, torch.compile")))
