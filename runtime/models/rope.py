"""Rotary position embedding (Su et al. 2021, "RoFormer"; HF ``apply_rotary_pos_emb``, "rotate_half" layout): the
inverse frequencies, the angles of a block of positions, the eager rotation, and the (cos, sin) tables the fused
kernels read. Plain torch (no Triton), imported by both layers.py (the eager path) and fused.py (the kernels), so
neither imports the other for it.
"""
from __future__ import annotations

import torch


def rope_inv_freq(head_dim: int, theta: float, device) -> torch.Tensor:
    """inv_freq [head_dim / 2] float32 = 1 / theta^(2i / D) (Su et al. 2021; HF ``_compute_default_rope_parameters``)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float, inv_freq: torch.Tensor | None = None
                ) -> torch.Tensor:
    """positions [bs, T] (long) -> the rotary angles [bs, T, head_dim / 2] float32: position x inv_freq
    (``rope_inv_freq``; pass it precomputed to spare a CUDA graph its nodes on every replay: same values)."""
    if inv_freq is None:
        inv_freq = rope_inv_freq(head_dim, theta, positions.device)
    return positions.to(torch.float32)[..., None] * inv_freq


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, HF "rotate_half" layout. x [bs, T, H, D], positions [bs, T] (long) -> same shape as x.

    cos/sin are computed from the positions on the fly (no table: fixed shapes, graph-safe). Su et al. 2021;
    HF ``apply_rotary_pos_emb``.
    """
    d = x.shape[-1]
    ang = rope_angles(positions, d, theta)  # [bs, T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, :, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, :, None]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    rot = torch.cat([-x2, x1], -1)
    return (xf * cos + rot * sin).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, inv_freq: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [bs, T, head_dim / 2] float32 of positions [bs, T] (long): ``rope_angles``, the angles
    ``apply_rope`` uses, once per forward for every layer (or once per draft block for all its steps: a
    [:, j:j + 1] slice of a block's tables is step j's)."""
    ang = rope_angles(positions, head_dim, theta, inv_freq)
    return ang.cos(), ang.sin()
