"""Fused Triton kernels of the cached forward (``RuntimeConfig.kernels = "fused"``): fewer, larger CUDA-graph nodes.

A graph replays its nodes back to back, but the H200 still leaves ~0.42 µs between two nodes (measured on
fixtures/traces/h200_runtime/h200_bench_overlap_bs8_B12: 56,762 same-launch gaps, median 0.42 µs); with the eager
building blocks of layers.py / gdn.py a bs-8 B-12 round was 6,616 nodes, 92% of its idle time those bubbles
(issue 6). With these kernels, the merged GEMMs and SDPA attention (layers.py) it is 1,066 nodes and 0.27x the
round time (benchmarks/results/h200_2026-11-30_s3/runtime.md). Each kernel here replaces a chain of PyTorch ops
with one node and the same arithmetic:

- ``rms_norm``: RMSNorm (layers.RMSNorm) of every row, optionally times sigmoid(gate) per row (the gated output
  norm of the linear-attention layer): one node instead of 7-9; ``add_rms_norm``: the residual add fused into it.
- ``silu_mul``: SwiGLU's silu(gate) * up from the merged gate|up projection.
- ``norm_rope``: the per-head q/k RMSNorm (Qwen3) and the rotary embedding (layers.apply_rope) of q or k in one
  node; cos/sin come from ``rope_tables``, computed once per forward for all layers.
- ``gdn_chain``: the gated delta rule over a chain of T tokens (gdn.gated_delta_rule_ref), with the L2
  normalisation of q and k, the gate g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) done inside,
  the state kept in registers, and optionally the state after every token written (what the verify's commit
  picks from). One node per layer instead of ~10 per token plus the gate glue. After fla's
  ``fused_recurrent_gated_delta_rule_fwd_kernel`` (flash-linear-attention, MIT), which cannot write the
  per-token states.

Arithmetic follows the references op for op (float32 math, the same casts to the activation dtype between ops), so
results agree with them to float32 rounding (reduction order differs); the speculative path and the greedy
reference use the same kernels. ``gdn_chain`` is one compiled kernel whatever T, start state or stores, so a token's
recurrence does not depend on the block length (tested bit for bit); the GEMMs and attention around it are cuBLAS /
SDPA kernels chosen per shape, equal to rounding.
Imported only where Triton is installed (CUDA machines); tests/test_fused_kernels.py runs them in Triton's CPU
interpreter against the references.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, z_ptr, y_ptr, n_cols, eps, HAS_GATE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = (x * r * w).to(y_ptr.dtype.element_ty)
    if HAS_GATE:
        z = tl.load(z_ptr + row).to(tl.float32)
        s = (1.0 / (1.0 + tl.exp(-z))).to(y_ptr.dtype.element_ty)
        y = (y.to(tl.float32) * s.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * n_cols + cols, y, mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight in float32, cast to x's dtype (layers.RMSNorm;
    Zhang & Sennrich 2019). x [..., N]; weight [N]; gate [...] (x's leading shape, one value per row) or None: with a
    gate, y * sigmoid(gate) (the reference's ``norm(o) * z.sigmoid()[..., None].to(o.dtype)``). Returns x's shape
    and dtype."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    z = gate.reshape(-1).contiguous() if gate is not None else x2
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, z, y, n, eps, HAS_GATE=gate is not None,
                                         BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)


@triton.jit
def _add_rms_norm_kernel(h_ptr, r_ptr, w_ptr, hout_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    h = tl.load(h_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    s = (h + r).to(hout_ptr.dtype.element_ty)          # the residual stream, rounded as ``h + r`` rounds it
    tl.store(hout_ptr + row * n_cols + cols, s, mask=m)
    x = s.to(tl.float32)
    rs = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * rs * w).to(y_ptr.dtype.element_ty), mask=m)


def add_rms_norm(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + residual, RMSNorm(h + residual)) in one node: the residual add of a pre-norm block fused into the next
    norm (the sum rounded to h's dtype first, exactly as ``h = h + residual`` then ``norm(h)``). h, residual
    [..., N] of one dtype; weight [N]. Returns two tensors of h's shape and dtype."""
    n = h.shape[-1]
    h2, r2 = h.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    hout, y = torch.empty_like(h2), torch.empty_like(h2)
    if h2.shape[0]:
        _add_rms_norm_kernel[(h2.shape[0],)](h2, r2, weight, hout, y, n, eps, BLOCK=triton.next_power_of_2(n))
    return hout.view(h.shape), y.view(h.shape)


@triton.jit
def _silu_mul_kernel(gu_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n_cols
    g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=m, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty).to(tl.float32)   # F.silu, rounded like its output
    tl.store(y_ptr + row * n_cols + cols, (s * u).to(y_ptr.dtype.element_ty), mask=m)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up from the merged projection gate_up [..., 2I] (gate | up): one node instead of two
    (``F.silu(gate) * up`` of layers.MLP, the same roundings). Returns [..., I] in gate_up's dtype."""
    n = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * n).contiguous()
    y = torch.empty(gu.shape[0], n, device=gu.device, dtype=gu.dtype)
    block = min(triton.next_power_of_2(n), 1024)
    if gu.shape[0]:
        _silu_mul_kernel[(gu.shape[0], triton.cdiv(n, block))](gu, y, n, BLOCK=block)
    return y.view(*gate_up.shape[:-1], n)


@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, n_heads, s_tok, eps, HALF: tl.constexpr,
                      HAS_NORM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)          # one (token, head) row of D = 2 * HALF
    tok = row // n_heads
    src = x_ptr + tok * s_tok + (row % n_heads) * 2 * HALF
    c = tl.arange(0, HALF)
    x1 = tl.load(src + c).to(tl.float32)
    x2 = tl.load(src + HALF + c).to(tl.float32)
    if HAS_NORM:  # layers.RMSNorm, then the cast to the activation dtype that apply_rope's .float() undoes
        r = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
        x1 = (x1 * r * tl.load(w_ptr + c).to(tl.float32)).to(y_ptr.dtype.element_ty).to(tl.float32)
        x2 = (x2 * r * tl.load(w_ptr + HALF + c).to(tl.float32)).to(y_ptr.dtype.element_ty).to(tl.float32)
    cs = tl.load(cos_ptr + tok * HALF + c)
    sn = tl.load(sin_ptr + tok * HALF + c)
    a1 = x1 * cs
    b1 = -x2 * sn
    a2 = x2 * cs
    b2 = x1 * sn
    tl.store(y_ptr + row * 2 * HALF + c, (a1 + b1).to(y_ptr.dtype.element_ty))
    tl.store(y_ptr + row * 2 * HALF + HALF + c, (a2 + b2).to(y_ptr.dtype.element_ty))


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [bs * T, head_dim / 2] float32 of positions [bs, T] (long): layers.rope_angles, the angles
    layers.apply_rope uses, once per forward for every layer."""
    from .layers import rope_angles

    ang = rope_angles(positions, head_dim, theta).reshape(-1, head_dim // 2)
    return ang.cos(), ang.sin()


def norm_rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor | None,
              eps: float) -> torch.Tensor:
    """Per-head RMSNorm (when ``weight`` is given) then the rotary embedding, "rotate_half" layout (Su et al. 2021;
    HF ``apply_rotary_pos_emb``). x [bs, T, H, D] (D even, a power of two); tables from ``rope_tables`` for the
    same [bs, T]. Returns x's shape and dtype. Equals ``apply_rope(norm(x))`` of layers.py."""
    bs, T, H, D = x.shape
    # a token's H x D block may sit inside a wider row (q, k, v split from one merged projection): read it in place
    x2 = x if (x.stride(3) == 1 and x.stride(2) == D and x.stride(0) == T * x.stride(1)) else x.contiguous()
    y = torch.empty(bs, T, H, D, device=x.device, dtype=x.dtype)
    if x2.numel():
        _norm_rope_kernel[(bs * T * H,)](x2, weight if weight is not None else x2, tables[0], tables[1], y, H,
                                         x2.stride(1), eps, HALF=D // 2, HAS_NORM=weight is not None)
    return y


# One compiled kernel for every call of a shape: T, the start state and the per-token stores are runtime arguments,
# not specialisations (a T == 1 decode step and a T == B verify must run the same machine code, or the compiler's
# contractions could make a token's result depend on the block length)
@triton.jit(do_not_specialize=["T", "use_h0", "store_all"])
def _gdn_chain_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, h0_ptr, o_ptr, hs_ptr, T,
                      s_qb, s_qt, s_vb, s_vt, s_ab, s_at, scale, use_h0, store_all,
                      HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    h = tl.zeros([K, BV], dtype=tl.float32)
    if use_h0 != 0:
        h += tl.load(h0_ptr + i_bh * K * V + o_k[:, None] * V + o_v[None, :])
    neg_a = -tl.exp(tl.load(alog_ptr + i_hv).to(tl.float32))
    dtb = tl.load(dtb_ptr + i_hv).to(tl.float32)
    for t in range(T):
        q = tl.load(q_ptr + i_b * s_qb + t * s_qt + i_hk * K + o_k).to(tl.float32)
        k = tl.load(k_ptr + i_b * s_qb + t * s_qt + i_hk * K + o_k).to(tl.float32)
        # F.normalize(x.float(), eps=1e-6) then the cast to the activation dtype (gdn.GatedDeltaNet.project)
        q = (q / tl.maximum(tl.sqrt(tl.sum(q * q, 0)), 1e-6)).to(v_ptr.dtype.element_ty).to(tl.float32) * scale
        k = (k / tl.maximum(tl.sqrt(tl.sum(k * k, 0)), 1e-6)).to(v_ptr.dtype.element_ty).to(tl.float32)
        v = tl.load(v_ptr + i_b * s_vb + t * s_vt + i_hv * V + o_v).to(tl.float32)
        x_a = tl.load(a_ptr + i_b * s_ab + t * s_at + i_hv).to(tl.float32) + dtb
        sp = tl.where(x_a > 20.0, x_a, tl.log(1.0 + tl.exp(tl.minimum(x_a, 20.0))))   # F.softplus, threshold 20
        g = neg_a * sp
        beta = 1.0 / (1.0 + tl.exp(-tl.load(b_ptr + i_b * s_ab + t * s_at + i_hv).to(tl.float32)))
        h = h * tl.exp(g)
        u = (v - tl.sum(h * k[:, None], 0)) * beta
        h = h + k[:, None] * u[None, :]
        o = tl.sum(h * q[:, None], 0)
        tl.store(o_ptr + ((i_b * T + t) * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty))
        if store_all != 0:
            tl.store(hs_ptr + ((i_b * T + t) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], h)
    if store_all == 0:
        tl.store(hs_ptr + i_bh * K * V + o_k[:, None] * V + o_v[None, :], h)


def gdn_chain(qkv: torch.Tensor, gates: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, hv: int,
              dk: int, dv: int, state: torch.Tensor | None = None, return_all: bool = False):
    """The gated delta rule over a chain of tokens, from the layer's raw projections (gdn.GatedDeltaNet.project +
    gdn.gated_delta_rule_ref in one node; Yang, Kautz, Hatamizadeh 2024).

    qkv [bs, T, 2*hk*dk + hv*dv] (in_proj_qkv's output: q | k | v); gates [bs, T, 3*hv] (in_proj_gates' output:
    b | a | z; z is not read); A_log, dt_bias [hv]; state [bs, hv, dk, dv] float32 or None (zeros). Value head h
    reads key head h // (hv / hk). dk and dv powers of two. Returns (o [bs, T, hv, dv] in qkv's dtype, the final
    state [bs, hv, dk, dv] float32, or with ``return_all`` the state after every token [bs, T, hv, dk, dv])."""
    bs, T, _ = qkv.shape
    qkv, gates = qkv.contiguous(), gates.contiguous()
    nq = hk * dk
    o = torch.empty(bs, T, hv, dv, device=qkv.device, dtype=qkv.dtype)
    hs = torch.empty((bs, T, hv, dk, dv) if return_all else (bs, hv, dk, dv), device=qkv.device, dtype=torch.float32)
    h0 = state.float().contiguous() if state is not None else hs
    bv = min(dv, 32)
    if bs and T:
        _gdn_chain_kernel[(dv // bv, bs * hv)](
            qkv, qkv[..., nq:], qkv[..., 2 * nq:], gates[..., hv:], gates, A_log, dt_bias, h0, o, hs, T,
            qkv.stride(0), qkv.stride(1), qkv.stride(0), qkv.stride(1), gates.stride(0), gates.stride(1),
            dk ** -0.5, int(state is not None), int(return_all), HK=hk, HV=hv, K=dk, V=dv, BV=bv, num_warps=4)
    elif state is not None and not return_all:
        hs.copy_(state)
    return o, hs
