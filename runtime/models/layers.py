"""Building blocks of the Qwen3-style decoder: RMSNorm, RoPE, grouped-query attention over gathered (paged) KV
with a length/causal mask, SwiGLU, and a top-k mixture of experts.

Shapes: ``bs`` requests, ``T`` new tokens each, ``S`` readable key columns, ``H`` query heads, ``Hkv`` KV heads,
``D`` head dim. Attention never looks at a key whose mask bit is off, so a key column may point at any finite
garbage (the fixed-width rectangles of DESIGN.md "The caches and the draft window").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .rope import apply_rope


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (Qwen3 / Llama)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


@dataclass
class KVView:
    """One full-attention layer's view of the paged KV pool for one forward.

    k_pool, v_pool: [num_token_slots, Hkv, D] (pages flattened: slot = page * P + offset), written in place.
    write_slots: [bs, T] long, where the new tokens' K/V go. read_slots: [bs, S] long, the key columns to gather.
    read_mask: [bs, T, S] bool, which columns each query may attend to (length, window and causal rules).
    """

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor
    read_mask: torch.Tensor


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked grouped-query attention. q [bs, T, H, D]; k, v [bs, S, Hkv, D]; mask [bs, T, S] bool (every query
    row needs one True). Returns [bs, T, H*D]. Softmax in float32; scale 1/sqrt(D) (Vaswani et al. 2017)."""
    bs, T, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.view(bs, T, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)           # bs, Hkv, G, T, D
    kt = k.permute(0, 2, 3, 1).unsqueeze(2)                               # bs, Hkv, 1, D, S
    scores = torch.matmul(qg, kt).float() * (D ** -0.5)                   # bs, Hkv, G, T, S
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    p = scores.softmax(-1).to(v.dtype)
    o = torch.matmul(p, v.permute(0, 2, 1, 3).unsqueeze(2))               # bs, Hkv, G, T, D
    return o.permute(0, 3, 1, 2, 4).reshape(bs, T, H * D)


def merged_weight(module: nn.Module, name: str, parts: list) -> torch.Tensor:
    """One weight [sum of out features, in] for several bias-free Linear layers that read the same input (q|k|v,
    gate|up), so the fused path runs one GEMM instead of several. Made once and cached on ``module`` under
    ``name``; the layers' own weights are re-pointed at slices of it (no second copy; a checkpoint load into them
    writes the merged tensor)."""
    return merged_parameters(module, name, [p.weight for p in parts])


def merged_parameters(module: nn.Module, name: str, params: list, stack: bool = False) -> torch.Tensor:
    """``params`` (nn.Parameters) as one tensor, concatenated along dim 0 (or with ``stack``, stacked along a new
    dim 0: every linear layer's A_log as [n_linear, Hv]); cached on ``module`` under ``name``, the parameters
    re-pointed at its slices (no second copy; a checkpoint load into them writes the merged tensor)."""
    w = getattr(module, name, None)
    # rebuilt only when the parameters moved (``module.to(...)`` gives the first one new storage); a checkpoint
    # load copies into the slices in place and keeps the merged tensor valid
    if w is None or params[0].data_ptr() != w.data_ptr():
        w = (torch.stack if stack else torch.cat)([p.detach() for p in params])
        o = 0
        for p in params:
            n = 1 if stack else p.shape[0]
            p.data = w[o] if stack else w[o:o + n]
            o += n
        object.__setattr__(module, name, w)  # a plain attribute: not a parameter, not in state_dict
    return w


# the fused path's attention for up to this many query tokens per row (decode, draft, verify: the graphed shapes) is
# fused.paged_attention; longer prefill chunks use SDPA over the gathered columns
PAGED_ATTENTION_MAX_T = 64


class Attention(nn.Module):
    """Qwen3 self-attention: q/k/v/o projections, optional per-head q/k RMSNorm, RoPE, GQA."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H, Hkv, D, hid = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(hid, H * D, bias=False)
        self.k_proj = nn.Linear(hid, Hkv * D, bias=False)
        self.v_proj = nn.Linear(hid, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, hid, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(D, cfg.rms_norm_eps)
        self._split_counters = []  # fused.paged_attention's semaphores (int32 zeros; each call leaves them 0)

    def split_counters(self, n: int, device) -> torch.Tensor:
        """At least n int32 zeros on ``device``, kept by the layer: the column splits merge in the attention node,
        no combine node. A larger call gets a larger buffer (made during a graph's warm-up, not inside its capture)
        and the old ones stay referenced: a graph captured earlier keeps reading its own."""
        c = self._split_counters[-1] if self._split_counters else None
        if c is None or c.numel() < n or c.device != device:
            c = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
            self._split_counters.append(c)
        return c

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv: KVView | None, rope=None) -> torch.Tensor:
        """x [bs, T, hidden] -> [bs, T, hidden]. Without ``kv``: plain causal attention over x itself. ``rope``:
        the (cos, sin) tables of models.rope.rope_tables for these positions (the fused path; needs ``kv``): one
        q|k|v GEMM, then two nodes: q/k norm + RoPE with the pool writes (fused.qkv_rope_write), and attention
        straight from the pools (fused.paged_attention; SDPA over the gathered columns above
        ``PAGED_ATTENTION_MAX_T`` query tokens). Same values as the eager path to rounding."""
        cfg = self.cfg
        bs, T, _ = x.shape
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if rope is not None:
            from .fused import attention_tiles, paged_attention, qkv_rope_write
            qkv = F.linear(x, merged_weight(self, "_qkv", [self.q_proj, self.k_proj, self.v_proj]))
            qn, kn = (self.q_norm.weight, self.k_norm.weight) if cfg.qk_norm else (None, None)
            q = qkv_rope_write(qkv, H, Hkv, rope, qn, kn, cfg.rms_norm_eps, kv.k_pool, kv.v_pool, kv.write_slots)
            if T <= PAGED_ATTENTION_MAX_T:
                counters = self.split_counters(attention_tiles(bs, T, H, Hkv), x.device)
                return self.o_proj(paged_attention(q, kv.k_pool, kv.v_pool, kv.read_slots, kv.read_mask, counters))
            # a long prefill chunk (eager, in no graph): the gathered columns and PyTorch's SDPA, whose kernels tile
            # the queries (paged_attention reads every key once per query)
            keys, vals = (p[kv.read_slots].to(q.dtype).transpose(1, 2) for p in (kv.k_pool, kv.v_pool))
            o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=kv.read_mask[:, None],
                                               enable_gqa=True)
            return self.o_proj(o.transpose(1, 2).reshape(bs, T, H * D))
        q = self.q_proj(x).view(bs, T, H, D)
        k = self.k_proj(x).view(bs, T, Hkv, D)
        v = self.v_proj(x).view(bs, T, Hkv, D)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta)
        if kv is None:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
            return self.o_proj(o.transpose(1, 2).reshape(bs, T, -1))
        slots = kv.write_slots.reshape(-1)
        kv.k_pool.index_copy_(0, slots, k.reshape(-1, *k.shape[2:]).to(kv.k_pool.dtype))
        kv.v_pool.index_copy_(0, slots, v.reshape(-1, *v.shape[2:]).to(kv.v_pool.dtype))
        keys = kv.k_pool[kv.read_slots]                                   # bs, S, Hkv, D
        vals = kv.v_pool[kv.read_slots]
        return self.o_proj(attend(q, keys.to(q.dtype), vals.to(q.dtype), kv.read_mask))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020; Llama / Qwen3)."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]. ``fused``: one gate|up GEMM and models.fused.silu_mul (same values)."""
        if fused:
            from .fused import silu_mul
            return self.down_proj(silu_mul(F.linear(x, merged_weight(self, "_gate_up", [self.gate_proj, self.up_proj]))))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Top-k mixture of SwiGLU experts (Qwen3-MoE names: ``gate``, ``experts.{e}``). Router softmax in float32,
    top-k, renormalised when ``norm_topk_prob``. Every expert runs on every token and is weighted by its (mostly
    zero) routing weight: E times the FLOPs of a routed kernel, but fixed shapes (graph-safe) and exact."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]; ``fused`` is accepted and ignored (the experts run eager)."""
        probs = self.gate(x).float().softmax(-1)
        top_w, top_i = probs.topk(self.k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter_(-1, top_i, top_w)      # bs, T, E
        out = torch.zeros_like(x, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            out = out + weights[..., e:e + 1] * expert(x).float()
        return out.to(x.dtype)
