"""Fused Triton kernels of the cached forward (``RuntimeConfig.kernels = "fused"``): fewer, larger CUDA-graph nodes.

A graph replays its nodes back to back, but the H200 still leaves ~0.42 µs between two nodes (measured on the
eager-era bench overlap bs-8 capture, 8 rounds: 56,762 same-launch gaps, median 0.42 µs); with the eager
building blocks of layers.py / gdn.py a bs-8 B-12 round was 6,616 nodes, 92% of its idle time those bubbles
(DESIGN.md "Graph-node bubbles"). With these kernels and the merged GEMMs (layers.py) it is 617 nodes and 0.148x the
eager round time (H200, 2026-11-30; 1,066 nodes and 0.27x before attention was read from the pools).
Each kernel here replaces a chain of PyTorch ops with one node (two for split attention) and the same arithmetic:

- ``rms_norm``: RMSNorm (layers.RMSNorm) of every row, optionally times sigmoid(gate) per row (the gated output
  norm of the linear-attention layer): one node instead of 7-9; ``add_rms_norm``: the residual add fused into it.
- ``silu_mul``: SwiGLU's silu(gate) * up from the merged gate|up projection.
- ``qkv_rope_write``: from the merged q|k|v projection, the per-head q/k RMSNorm (Qwen3), the rotary embedding
  (layers.apply_rope) and the writes of k and v into the paged pools, one node; cos/sin come from ``rope_tables``,
  computed once per forward (once per block for a draft block) for all layers.
- ``paged_attention``: masked grouped-query attention reading K/V straight from the pools by slot (no gathered
  copy, no mask bias), the queries of a KV head sharing each tile on tensor cores, the columns split across
  programs (flash-decoding) and merged by a second node.
- ``gdn_chain``: the gated delta rule over a chain of T tokens (gdn.gated_delta_rule_ref), with the L2
  normalisation of q and k, the gate g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) done inside,
  the state kept in registers, and optionally the state after every token written (what the verify's commit
  picks from). One node per layer instead of ~10 per token plus the gate glue. After fla's
  ``fused_recurrent_gated_delta_rule_fwd_kernel`` (flash-linear-attention, MIT), which cannot write the
  per-token states.

Arithmetic follows the references op for op (float32 math, the same casts to the activation dtype between ops), so
results agree with them to float32 rounding (reduction order differs); the speculative path and the greedy
reference use the same kernels. ``gdn_chain`` is one compiled kernel whatever T, start state or stores, so a token's
recurrence does not depend on the block length (tested bit for bit), and ``paged_attention``'s tiles and splits do
not depend on T either (same test); the GEMMs around them are cuBLAS kernels chosen per shape, equal to rounding.
Imported only where Triton is installed (CUDA machines); tests/runtime/test_fused_kernels.py runs them in Triton's
CPU interpreter against the references.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from .rope import rope_tables  # noqa: F401  (part of the fused path: the tables its kernels read)


def _interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (the tests), which computes tl.dot of bfloat16 tiles
    wrongly (Triton 3.9: garbage magnitudes); there paged_attention takes its float32 path (operands upcast, IEEE
    products: the same values a bf16 MMA gives). Triton's own switch where it has one, else TRITON_INTERPRET as
    Triton parses it (1 / true / on / yes)."""
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is not None and hasattr(runtime, "interpret"):
        return bool(runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, z_ptr, y_ptr, n_cols, eps, z_group, s_z, HAS_GATE: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = (x * r * w).to(y_ptr.dtype.element_ty)
    if HAS_GATE:
        z = tl.load(z_ptr + (row // z_group) * s_z + row % z_group).to(tl.float32)
        s = (1.0 / (1.0 + tl.exp(-z))).to(y_ptr.dtype.element_ty)
        y = (y.to(tl.float32) * s.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * n_cols + cols, y, mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight in float32, cast to x's dtype (layers.RMSNorm;
    Zhang & Sennrich 2019). x [..., N]; weight [N]; gate [...] (x's leading shape, one value per row) or None: with a
    gate, y * sigmoid(gate) (the reference's ``norm(o) * z.sigmoid()[..., None].to(o.dtype)``); the gate may be a
    slice of a wider projection (read in place). Returns x's shape and dtype."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    z = x2
    if gate is not None:  # [rows / G, G] with unit inner stride: the gate columns of the merged b | a | z rows
        z = gate.reshape(-1, gate.shape[-1]) if gate.dim() else gate.reshape(1, 1)
        if z.stride(-1) != 1:
            z = z.contiguous()
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, z, y, n, eps, z.shape[-1] if gate is not None else 1,
                                         z.stride(0) if gate is not None else 0, HAS_GATE=gate is not None,
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
def _argmax_embed_kernel(x_ptr, w_ptr, tok_ptr, e_ptr, n_cols, s_x, hidden, HAS_TABLE: tl.constexpr,
                         BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], 0, tl.int64)
    for start in range(0, n_cols, BLOCK):
        m = start + cols < n_cols
        x = tl.load(x_ptr + row * s_x + start + cols, mask=m, other=float("-inf")).to(tl.float32)
        bm = tl.max(x, 0)
        bi = tl.argmax(x, 0, tie_break_left=True).to(tl.int64) + start
        take = bm > best  # strict: an equal value later in the row keeps the first index (torch.argmax)
        best_i = tl.where(take, bi, best_i)
        best = tl.where(take, bm, best)
    tl.store(tok_ptr + row, best_i)
    if HAS_TABLE:
        for h0 in range(0, hidden, BLOCK_H):
            hc = h0 + tl.arange(0, BLOCK_H)
            tl.store(e_ptr + row * hidden + hc, tl.load(w_ptr + best_i * hidden + hc, mask=hc < hidden),
                     mask=hc < hidden)


def argmax_embed(logits: torch.Tensor, table: torch.Tensor | None = None):
    """Greedy tokens and, with ``table``, their embeddings in one node: ``logits.argmax(-1)`` (the first index of
    the maximum, as torch.argmax documents; logits finite) and ``table[tokens]`` (nn.Embedding's lookup: the next
    draft step's input). torch's generic reduce took ~10 µs a row set and the embedding's index_select ~6 µs on
    the bench preset's 32k vocabulary, once per draft step (H200, 2026-11-30).

    logits [..., V] (rows may be strided, the last dim unit-stride); table [V, hidden] contiguous or None.
    Returns (tokens [...] long, embeddings [..., hidden] in table's dtype, or None)."""
    V = logits.shape[-1]
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    n = x.shape[0]
    tok = torch.empty(n, device=x.device, dtype=torch.long)
    emb = None if table is None else torch.empty(n, table.shape[1], device=x.device, dtype=table.dtype)
    if n:
        hidden = 1 if table is None else table.shape[1]
        _argmax_embed_kernel[(n,)](x, tok if table is None else table.contiguous(), tok, tok if emb is None else emb,
                                   V, x.stride(0), hidden, HAS_TABLE=table is not None,
                                   BLOCK=min(triton.next_power_of_2(V), 4096),
                                   BLOCK_H=min(triton.next_power_of_2(hidden), 4096), num_warps=8)
    lead = logits.shape[:-1]
    return tok.view(lead), (None if emb is None else emb.view(*lead, -1))


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
def _qkv_rope_write_kernel(x_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, kp_ptr, vp_ptr, slot_ptr, T, H, HKV,
                           s_xb, s_xt, s_cb, s_ct, s_nb, s_nt, s_sb, s_st, s_kp, s_vp, eps, HALF: tl.constexpr,
                           HAS_NORM: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)          # one token (b, t) ...
    h = tl.program_id(1)                          # ... and one head of q | k | v (H + 2 HKV rows of D = 2 HALF)
    b = tok // T
    t = tok % T
    c = tl.arange(0, HALF)
    src = x_ptr + b * s_xb + t * s_xt + h * 2 * HALF
    x1 = tl.load(src + c).to(tl.float32)
    x2 = tl.load(src + HALF + c).to(tl.float32)
    slot = tl.load(slot_ptr + b * s_sb + t * s_st).to(tl.int64)
    if h < H + HKV:  # q or k: per-head RMSNorm (Qwen3), then RoPE
        if HAS_NORM:  # layers.RMSNorm, then the cast to the activation dtype that apply_rope's .float() undoes
            wsel = h < H
            w1 = tl.where(wsel, tl.load(wq_ptr + c), tl.load(wk_ptr + c)).to(tl.float32)
            w2 = tl.where(wsel, tl.load(wq_ptr + HALF + c), tl.load(wk_ptr + HALF + c)).to(tl.float32)
            r = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
            x1 = (x1 * r * w1).to(q_ptr.dtype.element_ty).to(tl.float32)
            x2 = (x2 * r * w2).to(q_ptr.dtype.element_ty).to(tl.float32)
        cs = tl.load(cos_ptr + b * s_cb + t * s_ct + c)
        sn = tl.load(sin_ptr + b * s_nb + t * s_nt + c)
        y1 = (x1 * cs + -x2 * sn).to(q_ptr.dtype.element_ty)
        y2 = (x2 * cs + x1 * sn).to(q_ptr.dtype.element_ty)
        if h < H:
            tl.store(q_ptr + (tok * H + h) * 2 * HALF + c, y1)
            tl.store(q_ptr + (tok * H + h) * 2 * HALF + HALF + c, y2)
        else:  # k, rounded to the activation dtype, then to the pool's (``k.to(k_pool.dtype)``)
            dst = kp_ptr + slot * s_kp + (h - H) * 2 * HALF
            tl.store(dst + c, y1.to(kp_ptr.dtype.element_ty))
            tl.store(dst + HALF + c, y2.to(kp_ptr.dtype.element_ty))
    else:  # v: copied into the pool as it is
        dst = vp_ptr + slot * s_vp + (h - H - HKV) * 2 * HALF
        tl.store(dst + c, x1.to(vp_ptr.dtype.element_ty))
        tl.store(dst + HALF + c, x2.to(vp_ptr.dtype.element_ty))


def _check_pools(k_pool: torch.Tensor, v_pool: torch.Tensor) -> None:
    """The kernels address a pool [num_token_slots, Hkv, D] by its slot stride only: each slot's Hkv x D block must
    be contiguous (the runtime's pools are); ValueError otherwise, never a silent wrong read."""
    for name, p in (("k_pool", k_pool), ("v_pool", v_pool)):
        if p.dim() != 3 or p.stride(2) != 1 or p.stride(1) != p.shape[2]:
            raise ValueError(f"{name} must be [slots, Hkv, D] with each slot's Hkv x D block contiguous, got shape "
                             f"{tuple(p.shape)} strides {tuple(p.stride())}")


def qkv_rope_write(qkv: torch.Tensor, heads: int, kv_heads: int, tables: tuple[torch.Tensor, torch.Tensor],
                   q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, k_pool: torch.Tensor,
                   v_pool: torch.Tensor, write_slots: torch.Tensor) -> torch.Tensor:
    """The attention prologue in one node: from the merged projection qkv [bs, T, (H + 2 Hkv) * D] (q | k | v,
    read in place), the per-head RMSNorm of q and k (when the weights [D] are given; Qwen3), the rotary embedding
    ("rotate_half" layout, Su et al. 2021; HF ``apply_rotary_pos_emb``) with ``tables`` from ``rope_tables`` ([bs, T,
    D / 2] each, any strides), and the writes of k and v into the pools [num_token_slots, Hkv, D] at write_slots
    [bs, T] (layers.Attention's ``index_copy_``). Returns q [bs, T, H, D] in qkv's dtype. Equals
    ``apply_rope(norm(q))`` and the eager path's pool writes (tests/runtime/test_fused_kernels.py). D a power of
    two."""
    bs, T, width = qkv.shape
    D = width // (heads + 2 * kv_heads)
    _check_pools(k_pool, v_pool)
    q = torch.empty(bs, T, heads, D, device=qkv.device, dtype=qkv.dtype)
    if qkv.stride(2) != 1:
        qkv = qkv.contiguous()
    cos, sin = tables
    if bs and T:
        w = q_weight if q_weight is not None else qkv
        _qkv_rope_write_kernel[(bs * T, heads + 2 * kv_heads)](
            qkv, w, k_weight if k_weight is not None else w, cos, sin, q, k_pool, v_pool, write_slots, T, heads,
            kv_heads, qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
            write_slots.stride(0),
            write_slots.stride(1), k_pool.stride(0), v_pool.stride(0), eps, HALF=D // 2,
            HAS_NORM=q_weight is not None)
    return q


@triton.jit
def _paged_attention_kernel(q_ptr, kp_ptr, vp_ptr, slot_ptr, m_ptr, o_ptr, ws_m_ptr, ws_l_ptr, ws_o_ptr, cnt_ptr,
                            T, S, H, HKV, G, split_len, s_qb, s_qt, s_sb, s_mb, s_mt, s_ms, s_kp, s_vp, scale,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, NSPLIT: tl.constexpr,
                            IEEE: tl.constexpr, FOLD: tl.constexpr):
    bk = tl.program_id(0).to(tl.int64)           # one (row b, KV head) ...
    sp = tl.program_id(1)                         # ... one split of the columns ...
    b = bk // HKV
    hk = bk % HKV
    r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)   # ... and BLOCK_M of its T x G query rows (t, g)
    t = r // G
    h = hk * G + r % G
    live = r < T * G
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * s_qb + t[:, None] * s_qt + h[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    lo = sp * split_len
    for s0 in range(lo, tl.minimum(lo + split_len, S), BLOCK_S):
        cols = s0 + tl.arange(0, BLOCK_S)
        inb = cols < S
        ok = tl.load(m_ptr + b * s_mb + t[:, None] * s_mt + cols[None, :] * s_ms,
                     mask=live[:, None] & inb[None, :], other=0) != 0
        # a block with no open column is skipped, and a row with none in a processed block is left as it was
        # (alpha = 1, p = 0): m, l and acc do not change by one bit, so neither the other rows nor the closed
        # columns after a query's last open one change its result
        used = tl.max(ok.to(tl.int32), 0) > 0    # columns open for some row of the tile: the only ones read
        if tl.max(used.to(tl.int32), 0) > 0:
            slot = tl.load(slot_ptr + b * s_sb + cols, mask=used, other=0).to(tl.int64)
            k = tl.load(kp_ptr + slot[:, None] * s_kp + hk * D + d[None, :], mask=used[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(ok, s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m_i - m_new))
            p = tl.where(ok, tl.exp(s - m_new[:, None]), 0.0)
            v = tl.load(vp_ptr + slot[:, None] * s_vp + hk * D + d[None, :], mask=used[:, None], other=0.0)
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    if NSPLIT == 1:
        tl.store(o_ptr + ((b * T + t[:, None]) * H + h[:, None]) * D + d[None, :],
                 (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=live[:, None])
    else:  # this split's running max, sum and unnormalised output, merged by _attention_combine_kernel ...
        w0 = ((b * T + t) * H + h) * NSPLIT
        tl.store(ws_m_ptr + w0 + sp, m_i, mask=live)
        tl.store(ws_l_ptr + w0 + sp, l_i, mask=live)
        tl.store(ws_o_ptr + (w0 + sp)[:, None] * D + d[None, :], acc, mask=live[:, None])
        if FOLD:  # ... or by the last split of this tile to finish (no second node): a split-K semaphore
            # (CUTLASS's serial split-K): every thread's stores, then a barrier, then one acq_rel atomic at GPU scope
            # publishes them; the program that counts NSPLIT - 1 reads every split back from global memory (.cg:
            # past L1) in split order, so the result does not depend on which split finished last, and resets the
            # counter to 0 for the next call (graph replays reuse the counters)
            tl.debug_barrier()
            c = cnt_ptr + bk * tl.num_programs(2) + tl.program_id(2)
            if tl.atomic_add(c, 1, sem="acq_rel", scope="gpu") == NSPLIT - 1:
                mx = tl.full([BLOCK_M], float("-inf"), tl.float32)
                for s_ in range(NSPLIT):
                    mx = tl.maximum(mx, tl.load(ws_m_ptr + w0 + s_, mask=live, other=float("-inf"),
                                                cache_modifier=".cg"))
                l_ = tl.zeros([BLOCK_M], tl.float32)
                out = tl.zeros([BLOCK_M, D], tl.float32)
                for s_ in range(NSPLIT):
                    m_s = tl.load(ws_m_ptr + w0 + s_, mask=live, other=float("-inf"), cache_modifier=".cg")
                    wt = tl.where(m_s == float("-inf"), 0.0, tl.exp(m_s - mx))   # a split with no open column: 0
                    l_ += tl.load(ws_l_ptr + w0 + s_, mask=live, other=0.0, cache_modifier=".cg") * wt
                    out += tl.load(ws_o_ptr + (w0 + s_)[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                                   cache_modifier=".cg") * wt[:, None]
                tl.store(o_ptr + ((b * T + t[:, None]) * H + h[:, None]) * D + d[None, :],
                         (out / l_[:, None]).to(o_ptr.dtype.element_ty), mask=live[:, None])
                tl.atomic_xchg(c, 0)


@triton.jit
def _attention_combine_kernel(ws_m_ptr, ws_l_ptr, ws_o_ptr, o_ptr, D: tl.constexpr, NSPLIT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)           # one (b, t, h)
    sp = tl.arange(0, NSPLIT)
    d = tl.arange(0, D)
    m = tl.load(ws_m_ptr + row * NSPLIT + sp)
    mx = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx))   # a split with no open column weighs 0
    l_ = tl.sum(tl.load(ws_l_ptr + row * NSPLIT + sp) * w, 0)
    acc = tl.sum(tl.load(ws_o_ptr + (row * NSPLIT + sp[:, None]) * D + d[None, :]) * w[:, None], 0)
    tl.store(o_ptr + row * D + d, (acc / l_).to(o_ptr.dtype.element_ty))


def attention_splits(S: int) -> int:
    """How many column splits ``paged_attention`` runs in parallel for S key columns: next_power_of_2(ceil(S /
    256)), at most 16 (flash-decoding, Dao et al. 2023: a decode row has too few queries to fill the GPU). A
    function of S only, so a query's result never depends on T."""
    return min(16, triton.next_power_of_2(triton.cdiv(S, 256)))


def attention_tiles(bs: int, T: int, H: int, Hkv: int) -> int:
    """How many (row, KV head, 16 query rows) tiles ``paged_attention`` runs: the semaphores ``counters`` needs."""
    return bs * Hkv * triton.cdiv(T * (H // Hkv), 16)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, read_slots: torch.Tensor,
                    mask: torch.Tensor, counters: torch.Tensor | None = None) -> torch.Tensor:
    """Masked grouped-query attention straight from the paged pools (layers.attend over ``pool[read_slots]``: no
    gathered copy of K and V, no mask bias). q [bs, T, H, D] (D a power of two, >= 16); k_pool, v_pool
    [num_token_slots, Hkv, D]; read_slots [bs, S] long; mask [bs, T, S] bool, any strides (a draft step's slice of
    its block's masks), every query row with one True. Returns [bs, T, H * D] in q's dtype.

    One program per (row, KV head, column split, 16 query rows): the T x G queries that share a KV head read each
    K/V tile once, on tensor cores (q k^T and p v as ``tl.dot``; float32 inputs at full precision, not TF32; under
    Triton's interpreter always the float32 path, see ``_interpreted``). Softmax
    in float32 with scale 1/sqrt(D) (Vaswani et al. 2017), one pass with the running max and sum (Milakov &
    Gimelshein 2018; flash attention), 64 columns at a time, p rounded to V's dtype before p v as ``attend`` does;
    the splits (``attention_splits``) merged by a second node, or, given ``counters`` (int32, at least
    ``attention_tiles`` of them, all 0; every call leaves them 0, so one buffer serves every call on one stream and
    every graph replay), by the last split of each tile to finish, in the same node (a split-K semaphore; the merge
    reads the splits in order, so it does not depend on which one finished last). Tiles and splits do not depend on T and a row's
    arithmetic does not depend on the other rows, so the verify block and a one-token step agree bit for bit, as
    long as the columns read hold finite values (a column open for one row of a tile is read for all: an inf or NaN
    in V there reaches the rows it is closed to through p = 0; the eager path is non-finite then too). Only columns
    open for some row are loaded. ValueError on a head dim that is not a power of two >= 16, a pool whose slots
    are not contiguous, or too few ``counters``."""
    bs, T, H, D = q.shape
    S, Hkv = read_slots.shape[1], k_pool.shape[1]
    G = H // Hkv
    if D < 16 or D & (D - 1):
        raise ValueError(f"paged_attention needs a power-of-two head dim >= 16, got {D}")
    _check_pools(k_pool, v_pool)
    o = torch.empty(bs, T, H * D, device=q.device, dtype=q.dtype)
    if q.stride(3) != 1 or q.stride(2) != D:
        q = q.contiguous()
    if read_slots.stride(1) != 1:
        read_slots = read_slots.contiguous()
    m8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    ns = attention_splits(S)
    split_len = triton.cdiv(triton.cdiv(S, ns), 64) * 64
    fold = counters is not None and ns > 1
    if fold and (counters.dtype != torch.int32 or counters.numel() < attention_tiles(bs, T, H, Hkv)):
        raise ValueError(f"paged_attention needs {attention_tiles(bs, T, H, Hkv)} int32 counters, got "
                         f"{counters.numel()} {counters.dtype}")
    ws = [o] * 3
    if ns > 1:
        ws = [torch.empty(bs * T * H * ns, device=q.device, dtype=torch.float32) for _ in range(2)]
        ws.append(torch.empty(bs * T * H * ns, D, device=q.device, dtype=torch.float32))
    if bs and T:
        _paged_attention_kernel[(bs * Hkv, ns, triton.cdiv(T * G, 16))](
            q, k_pool, v_pool, read_slots, m8, o, *ws, counters if fold else o, T, S, H, Hkv, G, split_len,
            q.stride(0), q.stride(1), read_slots.stride(0), m8.stride(0), m8.stride(1), m8.stride(2),
            k_pool.stride(0), v_pool.stride(0), D ** -0.5, D=D, BLOCK_M=16, BLOCK_S=64, NSPLIT=ns,
            IEEE=q.dtype == torch.float32 or _interpreted(), FOLD=fold, num_warps=4)
        if ns > 1 and not fold:
            _attention_combine_kernel[(bs * T * H,)](*ws, o, D=D, NSPLIT=ns)
    return o


# One compiled kernel for every call of a shape: T, the start state, the per-token stores, the per-row lengths and
# the layer axis are runtime arguments, not specialisations (a T == 1 decode step, a T == B verify and the commit's
# recompute of the accepted prefix must run the same machine code, or the compiler's contractions could make a
# token's result depend on which of them computed it)
@triton.jit(do_not_specialize=["T", "use_h0", "use_rows", "store", "use_len", "store_o"])
def _gdn_chain_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, h0_ptr, rows_ptr, o_ptr, hs_ptr, len_ptr,
                      T, s_qb, s_qt, s_vb, s_vt, s_ab, s_at, s_ql, s_pl, s_hl, scale, use_h0, use_rows, store, use_len,
                      store_o, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BV: tl.constexpr):
    # store: 0 the final state into hs[b], 1 the state after every token into hs[b, t], 2 the final state back
    # into the start state's place (h0[rows[b]] of the pool: the commit's in-place update), 3 no state
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_l = tl.program_id(2).to(tl.int64)  # layer (the commit runs every linear layer in one launch)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    q_ptr += i_l * s_ql
    k_ptr += i_l * s_ql
    v_ptr += i_l * s_ql
    a_ptr += i_l * s_ql
    b_ptr += i_l * s_ql
    h0_ptr += i_l * s_hl
    h = tl.zeros([K, BV], dtype=tl.float32)
    src = i_b
    if use_rows != 0:
        src = tl.load(rows_ptr + i_b).to(tl.int64)
    if use_h0 != 0:  # row i_b's start state: h0[i_b], or h0[rows[i_b]] of a whole pool (no gathered copy)
        h += tl.load(h0_ptr + (src * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :])
    n_t = T
    if use_len != 0:  # this row's own length (the commit: its accepted tokens)
        n_t = tl.load(len_ptr + i_b).to(tl.int32)
    neg_a = -tl.exp(tl.load(alog_ptr + i_l * s_pl + i_hv).to(tl.float32))
    dtb = tl.load(dtb_ptr + i_l * s_pl + i_hv).to(tl.float32)
    for t in range(n_t):
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
        if store_o != 0:
            o = tl.sum(h * q[:, None], 0)
            tl.store(o_ptr + ((i_b * T + t) * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty))
        if store == 1:
            tl.store(hs_ptr + ((i_b * T + t) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], h)
    if store == 0:
        tl.store(hs_ptr + i_bh * K * V + o_k[:, None] * V + o_v[None, :], h)
    if store == 2:
        tl.store(h0_ptr + (src * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], h)


def gdn_chain(qkv: torch.Tensor, gates: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, hv: int,
              dk: int, dv: int, state: torch.Tensor | None = None, return_all: bool = False,
              state_out: torch.Tensor | None = None, state_rows: torch.Tensor | None = None,
              store_states: bool = True):
    """The gated delta rule over a chain of tokens, from the layer's raw projections (gdn.GatedDeltaNet.project +
    gdn.gated_delta_rule_ref in one node; Yang, Kautz, Hatamizadeh 2024).

    qkv [bs, T, 2*hk*dk + hv*dv] (in_proj_qkv's output: q | k | v); gates [bs, T, 3*hv] (in_proj_gates' output:
    b | a | z; z is not read); A_log, dt_bias [hv]; state [bs, hv, dk, dv] float32 or None (zeros). Value head h
    reads key head h // (hv / hk). dk and dv powers of two. Returns (o [bs, T, hv, dv] in qkv's dtype, the final
    state [bs, hv, dk, dv] float32, or with ``return_all`` the state after every token [bs, T, hv, dk, dv]).
    ``state_out``: a contiguous float32 tensor of that shape to write the state(s) into (a layer's slice of the
    model's stacked states: no stacking copy afterwards). ``state_rows`` [bs] long: ``state`` is a whole pool
    [num_slots, hv, dk, dv] float32 and row b starts from state[state_rows[b]], read in place.
    ``store_states=False``: no state written at all (returns (o, None)): the fused verify, whose commit recomputes
    the accepted prefix's state (``gdn_recompute``)."""
    bs, T, _ = qkv.shape
    # read in place (slices of one merged projection are fine): only the last dim must be unit-stride
    qkv, gates = (x if x.stride(-1) == 1 else x.contiguous() for x in (qkv, gates))
    nq = hk * dk
    o = torch.empty(bs, T, hv, dv, device=qkv.device, dtype=qkv.dtype)
    shape = ((bs, T, hv, dk, dv) if return_all else (bs, hv, dk, dv)) if store_states else (1,)
    hs = state_out if state_out is not None else torch.empty(shape, device=qkv.device, dtype=torch.float32)
    if tuple(hs.shape) != shape or hs.dtype != torch.float32 or not hs.is_contiguous():
        raise ValueError(f"state_out must be a contiguous float32 {shape}, got {tuple(hs.shape)} {hs.dtype}")
    h0 = state.float().contiguous() if state is not None else hs
    rows = state_rows.contiguous() if state_rows is not None and state is not None else hs
    bv = min(dv, 32)
    if bs and T:
        _gdn_chain_kernel[(dv // bv, bs * hv, 1)](
            qkv, qkv[..., nq:], qkv[..., 2 * nq:], gates[..., hv:], gates, A_log, dt_bias, h0, rows, o, hs, hs, T,
            qkv.stride(0), qkv.stride(1), qkv.stride(0), qkv.stride(1), gates.stride(0), gates.stride(1), 0, 0, 0,
            dk ** -0.5, int(state is not None), int(state is not None and state_rows is not None),
            (1 if return_all else 0) if store_states else 3, 0, 1, HK=hk, HV=hv, K=dk, V=dv, BV=bv, num_warps=4)
    elif state is not None and not return_all and store_states:
        hs.copy_(state if state_rows is None else state[state_rows])
    return o, (hs if store_states else None)


def gdn_recompute(pool: torch.Tensor, inputs: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                  rows: torch.Tensor, n_tokens: torch.Tensor, hk: int, hv: int, dk: int, dv: int) -> None:
    """The linear-state commit by recompute, in place, every layer in one node: for each linear layer l and row i,
    pool[l, rows[i]] <- the gated delta rule run from pool[l, rows[i]] over the first n_tokens[i] tokens of that
    row's verify inputs (Yang, Kautz, Hatamizadeh 2024). The same compiled kernel as ``gdn_chain``, so the state
    equals, bit for bit, the one the verify would have stored after token n_tokens[i] - 1, without the verify
    writing the state after every block token (~1 MB a token, layer and row on the bench preset).

    pool [n_linear, num_slots, hv, dk, dv] float32 contiguous (LinearStatePool.pool); inputs [n_linear, nb, T,
    2*hk*dk + hv*dv + 3*hv] (each layer's merged q|k|v|b|a|z projection of the verify's tokens, as the fused
    verify stacks them); A_log, dt_bias [n_linear, hv] (each layer's parameters, stacked); rows [nb] long, distinct
    slots; n_tokens [nb] integer in [0, T]. Fixed shapes, no host sync."""
    nl, nb, T, width = inputs.shape
    if nl == 0 or nb == 0:
        return
    if not (pool.is_contiguous() and inputs.is_contiguous() and pool.dtype == torch.float32):
        raise ValueError("gdn_recompute needs a contiguous float32 pool and contiguous inputs")
    nq, gates = hk * dk, 2 * hk * dk + hv * dv
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    bv = min(dv, 32)
    _gdn_chain_kernel[(dv // bv, nb * hv, nl)](
        inputs, inputs[..., nq:], inputs[..., 2 * nq:], inputs[..., gates + hv:], inputs[..., gates:], A_log, dt_bias,
        pool, rows.contiguous(), pool, pool, n_tokens.contiguous(), T, inputs.stride(1), inputs.stride(2),
        inputs.stride(1), inputs.stride(2), inputs.stride(1), inputs.stride(2), inputs.stride(0), A_log.stride(0),
        pool.stride(0), dk ** -0.5, 1, 1, 2, 1, 0, HK=hk, HV=hv, K=dk, V=dv, BV=bv, num_warps=4)


@triton.jit
def _gdn_inputs_kernel(qkv_ptr, gates_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_qt, s_gt,
                       HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)   # flat token index b * T + t
    i_hv = tl.program_id(1)
    i_hk = i_hv // (HV // HK)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    src = qkv_ptr + i_t * s_qt
    q = tl.load(src + i_hk * K + o_k).to(tl.float32)
    k = tl.load(src + HK * K + i_hk * K + o_k).to(tl.float32)
    # F.normalize(x.float(), dim=-1, eps=1e-6) then the cast to the activation dtype (gdn.GatedDeltaNet.project)
    q = q / tl.maximum(tl.sqrt(tl.sum(q * q, 0)), 1e-6)
    k = k / tl.maximum(tl.sqrt(tl.sum(k * k, 0)), 1e-6)
    dst = (i_t * HV + i_hv)
    tl.store(q_ptr + dst * K + o_k, q.to(q_ptr.dtype.element_ty))
    tl.store(k_ptr + dst * K + o_k, k.to(k_ptr.dtype.element_ty))
    tl.store(v_ptr + dst * V + o_v, tl.load(src + 2 * HK * K + i_hv * V + o_v))
    gts = gates_ptr + i_t * s_gt
    x_a = tl.load(gts + HV + i_hv).to(tl.float32) + tl.load(dtb_ptr + i_hv).to(tl.float32)
    sp = tl.where(x_a > 20.0, x_a, tl.log(1.0 + tl.exp(tl.minimum(x_a, 20.0))))   # F.softplus, threshold 20
    tl.store(g_ptr + dst, -tl.exp(tl.load(alog_ptr + i_hv).to(tl.float32)) * sp)
    beta = 1.0 / (1.0 + tl.exp(-tl.load(gts + i_hv).to(tl.float32)))
    tl.store(beta_ptr + dst, beta.to(beta_ptr.dtype.element_ty))


def gdn_inputs(qkv: torch.Tensor, gates: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, hv: int,
               dk: int, dv: int):
    """The gated delta rule's per-token inputs in one node (gdn.GatedDeltaNet.project's ~25 eager ops for a long
    prefill chunk, whose recurrence runs in flash-linear-attention's chunked kernel; Yang, Kautz, Hatamizadeh 2024).

    qkv [bs, T, 2*hk*dk + hv*dv] (q | k | v, in_proj_qkv's output), gates [bs, T, 3*hv] (b | a | z; z not read):
    each may be a column range of one merged projection (rows strided, last dim unit-stride). A_log, dt_bias [hv].
    dk, dv powers of two. Returns contiguous (q, k [bs, T, hv, dk] L2-normalised, value head h reading key head
    h // (hv / hk); v [bs, T, hv, dv], all in qkv's dtype; g [bs, T, hv] float32 = -exp(A_log) * softplus(a +
    dt_bias); beta [bs, T, hv] in qkv's dtype = sigmoid(b)): what ``project`` returns, beta cast as
    ``gated_delta_rule_fla`` casts it."""
    bs, T, _ = qkv.shape
    if qkv.stride(-1) != 1 or gates.stride(-1) != 1 or (bs > 1 and (qkv.stride(0) != T * qkv.stride(1)
                                                                     or gates.stride(0) != T * gates.stride(1))):
        qkv, gates = qkv.contiguous(), gates.contiguous()
    dev, dt = qkv.device, qkv.dtype
    q = torch.empty(bs, T, hv, dk, device=dev, dtype=dt)
    k = torch.empty_like(q)
    v = torch.empty(bs, T, hv, dv, device=dev, dtype=dt)
    g = torch.empty(bs, T, hv, device=dev, dtype=torch.float32)
    beta = torch.empty(bs, T, hv, device=dev, dtype=dt)
    if bs and T:
        _gdn_inputs_kernel[(bs * T, hv)](qkv, gates, A_log, dt_bias, q, k, v, g, beta, qkv.stride(1),
                                         gates.stride(1), HK=hk, HV=hv, K=dk, V=dv, num_warps=1)
    return q, k, v, g, beta


@triton.jit
def _commit_states_kernel(src_ptr, dst_ptr, rows_ptr, idx_ptr, n, s_src_l, s_src_b, s_src_t, s_dst_l, s_dst_s,
                          BLOCK: tl.constexpr):
    lyr = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    t = tl.load(idx_ptr + i).to(tl.int64)
    r = tl.load(rows_ptr + i).to(tl.int64)
    x = tl.load(src_ptr + lyr * s_src_l + i * s_src_b + t * s_src_t + offs, mask=m)
    tl.store(dst_ptr + lyr * s_dst_l + r * s_dst_s + offs, x, mask=m)


def commit_states(pool: torch.Tensor, states_all: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> None:
    """pool[:, rows[i]] = states_all[:, i, index[i]] in one node, one pass over the bytes (the eager path gathers the
    picked states into a temporary, then scatters it: twice the traffic, two nodes; ~0.35 ms a round for the bench
    target's 18 layers at bs 8 on the H200). pool [L, num_slots, *S]; states_all [L, nb, T, *S] with the same S
    (a gated-delta-rule state: Hv x dk x dv float32), each state contiguous; rows [nb], index [nb] long on the
    device, index[i] in [0, T). A pure copy: bit for bit what ``LinearStatePool.commit_at``'s eager path writes
    (rows that repeat, the padding rows' scratch slot, get one of their states, as with index_copy_). ValueError when a
    state is not contiguous or the shapes disagree."""
    L, nb, T = states_all.shape[:3]
    S = states_all.shape[3:]
    if pool.shape[0] != L or pool.shape[2:] != S or pool.dtype != states_all.dtype or rows.shape != (nb,) \
            or index.shape != (nb,):
        raise ValueError(f"commit_states: pool {tuple(pool.shape)} {pool.dtype}, states {tuple(states_all.shape)} "
                         f"{states_all.dtype}, rows {tuple(rows.shape)}, index {tuple(index.shape)} disagree")
    n = math.prod(S)
    packed = tuple(math.prod(S[k + 1:]) for k in range(len(S)))  # a contiguous state's strides
    if n and not (pool.stride()[2:] == packed and states_all.stride()[3:] == packed):
        raise ValueError("commit_states needs each state contiguous")
    if L and nb and n:
        BLOCK = 4096
        _commit_states_kernel[(L, nb, triton.cdiv(n, BLOCK))](
            states_all, pool, rows, index, n, states_all.stride(0), states_all.stride(1), states_all.stride(2),
            pool.stride(0), pool.stride(1), BLOCK=BLOCK)
