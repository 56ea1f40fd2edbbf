"""A chunked gated delta rule in plain PyTorch, differentiable by autograd: the tiny pair's training path on CUDA
(scripts/train_pair.py installs it with ``install``; the runtime never calls it).

Why it exists: fla-core 0.6.0 refuses the backward of ``chunk_gated_delta_rule`` on Hopper with Triton >= 3.4 and
< 3.7.1 ("produces incorrect results for gated chunk_bwd_dqkwg", fla issue #640), and the H200 image carries
Triton 3.6.0 (seen 2026-11-30); the runtime's per-token recurrence (gdn.gated_delta_rule_ref) is exact but launches
~10 kernels per token and layer, too slow to train on. This is fla's own PyTorch reference
``fla.ops.gated_delta_rule.naive.naive_chunk_gated_delta_rule`` (MIT; Yang, Kautz, Hatamizadeh 2024, "Gated Delta
Networks", the WY representation of the chunkwise form) with its row-by-row forward substitution replaced by one
unit-lower-triangular solve, so a chunk costs a few matrix products instead of ~c small kernels.

Per chunk of c tokens (decay d = cumsum of g inside the chunk, L[i, j] = exp(d_i - d_j) for j <= i):
    A = strict_lower((beta k) k^T * L);  T = (I + A)^-1
    u = T (beta v);  w = T (beta k * exp(d))
    v' = u - w S;  o = (q exp(d)) S + (q k^T * L * causal) v'
    S <- exp(d_last) S + (k * exp(d_last - d))^T v'
tests/runtime/test_tiny_pair.py checks outputs, final states and gradients against gdn.gated_delta_rule_ref.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_gated_delta_rule_torch(q, k, v, g, beta, scale: float, initial_state=None, chunk_size: int = 64):
    """o [bs, T, H, dv] float32 and the final state [bs, H, dk, dv] float32.

    q, k [bs, T, H, dk] (L2-normalised by the caller); v [bs, T, H, dv]; g [bs, T, H] log-decay (<= 0);
    beta [bs, T, H]; initial_state [bs, H, dk, dv] or None (zeros). Computed in float32 with autocast off (the
    products inside a chunk are small; bf16 there would cost accuracy, not time). Any T (padded to the chunk).
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        bs, T, H, dk = q.shape
        dv = v.shape[-1]
        q, k, v, beta, g = (x.transpose(1, 2).float() for x in (q, k, v, beta, g))  # [bs, H, T, ...]
        pad = (-T) % chunk_size
        if pad:
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
            beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
        n, c = (T + pad) // chunk_size, chunk_size
        q = (q * scale).view(bs, H, n, c, dk)
        k_beta = (k * beta[..., None]).view(bs, H, n, c, dk)
        k = k.view(bs, H, n, c, dk)
        v = (v * beta[..., None]).view(bs, H, n, c, dv)
        decay = g.view(bs, H, n, c).cumsum(-1)
        L = (decay[..., :, None] - decay[..., None, :]).tril().exp().tril()  # exponents <= 0 on and below the diagonal
        eye = torch.eye(c, device=q.device)
        A = ((k_beta @ k.transpose(-1, -2)) * L).tril(-1)
        Tinv = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
        u = Tinv @ v
        w = Tinv @ (k_beta * decay.exp()[..., None])
        S = q.new_zeros(bs, H, dk, dv) if initial_state is None else initial_state.float()
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        outs = []
        for i in range(n):
            qi, ki, di = q[:, :, i], k[:, :, i], decay[:, :, i]
            attn = (qi @ ki.transpose(-1, -2) * L[:, :, i]).masked_fill(~causal, 0)
            v_new = u[:, :, i] - w[:, :, i] @ S
            outs.append((qi * di[..., None].exp()) @ S + attn @ v_new)
            last = di[..., -1:]
            S = S * last[..., None].exp() + (ki * (last - di).exp()[..., None]).transpose(-1, -2) @ v_new
        o = torch.stack(outs, 2).reshape(bs, H, n * c, dv)[:, :, :T].transpose(1, 2)
    return o, S


def install(gdn, devices: tuple[str, ...] = ("cuda",)) -> None:
    """Route gaptrace.runtime.models.gdn's dispatch through :func:`chunk_gated_delta_rule_torch` for tensors on
    ``devices`` whenever one final state is enough (training, held-out loss, the no-cache τ evaluation); the
    runtime's own dispatch otherwise (``return_all``, other devices). Idempotent."""
    orig = getattr(gdn.gated_delta_rule, "_orig", gdn.gated_delta_rule)

    def gated_delta_rule(q, k, v, g, beta, state=None, return_all: bool = False):
        if q.device.type in devices and not return_all:
            o, final = chunk_gated_delta_rule_torch(q, k, v, g, beta, q.shape[-1] ** -0.5, state)
            return o.to(v.dtype), final
        return orig(q, k, v, g, beta, state, return_all)

    gated_delta_rule._orig = orig
    gdn.gated_delta_rule = gated_delta_rule
