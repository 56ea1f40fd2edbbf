"""Gated delta rule linear attention (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks"; Qwen3-Next).

Per head, with a recurrent state S [dk, dv] (float32), for each token t:

    S <- exp(g_t) * S                      (decay, g_t <= 0)
    u  = beta_t * (v_t - S^T k_t)          (delta rule correction)
    S <- S + k_t u^T
    o_t = S^T (q_t / sqrt(dk))

``gated_delta_rule_ref`` is the plain PyTorch recurrence (CPU, and the verify / decode path everywhere: it can
return the state after every token, which the speculative commit selects from). ``gated_delta_rule_fla`` calls
flash-linear-attention's chunked kernel (``fla.ops.gated_delta_rule.chunk_gated_delta_rule``) on CUDA, for
training and prefill; tests/runtime/test_gpu.py checks it against the reference.

The layer follows Qwen3-Next without its short convolution: fused q/k/v projection, L2-normalised q and k,
beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per-head RMSNorm of the output times a per-head
sigmoid gate, then the output projection.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .layers import RMSNorm

try:  # optional: only on CUDA machines with flash-linear-attention / fla-core installed
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as _fla_chunk
except Exception:  # ImportError, or Triton missing on a CPU box
    _fla_chunk = None


def fla_available() -> bool:
    """True when flash-linear-attention's gated-delta-rule kernel imported."""
    return _fla_chunk is not None


def gated_delta_rule_ref(q, k, v, g, beta, state=None, return_all: bool = False):
    """Reference recurrence. q, k [bs, T, H, dk]; v [bs, T, H, dv]; g, beta [bs, T, H]; state [bs, H, dk, dv]
    float32 or None (zeros). Returns (o [bs, T, H, dv] in v's dtype, states): states is the final state
    [bs, H, dk, dv], or with ``return_all`` the state after each token [bs, T, H, dk, dv]. All in float32;
    elementwise products and sums only, so a token's result does not depend on T or on the batch."""
    bs, T, H, dk = k.shape
    dv = v.shape[-1]
    S = torch.zeros(bs, H, dk, dv, device=v.device, dtype=torch.float32) if state is None else state.float()
    qf, kf, vf = q.float() * dk ** -0.5, k.float(), v.float()
    decay, betaf = g.float().exp(), beta.float()
    outs, states = [], []
    for t in range(T):
        S = S * decay[:, t, :, None, None]
        kt = kf[:, t, :, :, None]                                         # bs, H, dk, 1
        u = (vf[:, t] - (kt * S).sum(-2)) * betaf[:, t, :, None]          # bs, H, dv
        S = S + kt * u[:, :, None, :]
        outs.append((qf[:, t, :, :, None] * S).sum(-2))
        if return_all:
            states.append(S)
    o = torch.stack(outs, 1).to(v.dtype)
    return o, (torch.stack(states, 1) if return_all else S)


def gated_delta_rule_tree(q, k, v, g, beta, parents, state=None):
    """The reference recurrence over a token TREE (DESIGN.md "Draft trees"): token t continues from the state after
    its parent ``parents[:, t]`` (an earlier index) instead of token t - 1; -1 = continue from ``state`` (the root).
    Shapes as ``gated_delta_rule_ref``; parents [bs, T] long with parents[:, t] < t. Returns (o [bs, T, H, dv],
    states [bs, T, H, dk, dv] float32: the state after each token, i.e. after its whole ancestor path).

    Exact: a token's arithmetic is ``gated_delta_rule_ref``'s step applied to its parent's state, so every node's
    output and state equal, bit for bit, those of the chain recurrence over its ancestor path (a recurrent layer
    cannot share one state per position across branches; each node carries its own). Fixed shapes, no host sync."""
    bs, T, H, dk = k.shape
    dv = v.shape[-1]
    S0 = torch.zeros(bs, H, dk, dv, device=v.device, dtype=torch.float32) if state is None else state.float()
    qf, kf, vf = q.float() * dk ** -0.5, k.float(), v.float()
    decay, betaf = g.float().exp(), beta.float()
    every = torch.zeros(bs, T, H, dk, dv, device=v.device, dtype=torch.float32)
    rows = torch.arange(bs, device=v.device)
    outs = []
    for t in range(T):
        par = parents[:, t]
        S = torch.where((par < 0)[:, None, None, None], S0, every[rows, par.clamp(min=0)])  # the parent's state
        S = S * decay[:, t, :, None, None]
        kt = kf[:, t, :, :, None]
        u = (vf[:, t] - (kt * S).sum(-2)) * betaf[:, t, :, None]
        S = S + kt * u[:, :, None, :]
        outs.append((qf[:, t, :, :, None] * S).sum(-2))
        every[:, t] = S
    return torch.stack(outs, 1).to(v.dtype), every


def gated_delta_rule_fla(q, k, v, g, beta, state=None):
    """flash-linear-attention's chunked kernel; same arguments and (o, final state) as the reference."""
    q, k = q.to(v.dtype), k.to(v.dtype)  # fla's tl.dot needs one dtype
    o, final = _fla_chunk(q.contiguous(), k.contiguous(), v.contiguous(), g.float().contiguous(),
                          beta.to(v.dtype).contiguous(), scale=q.shape[-1] ** -0.5,
                          initial_state=None if state is None else state.float().contiguous(),
                          output_final_state=True)
    return o, final


def gated_delta_rule(q, k, v, g, beta, state=None, return_all: bool = False):
    """Dispatch: the fla kernel on CUDA when it is installed, T > 1 and one final state is enough (training,
    prefill); the reference recurrence otherwise (one-token decode and the verify, on every device)."""
    if _fla_chunk is not None and q.is_cuda and not return_all and q.shape[1] > 1:
        return gated_delta_rule_fla(q, k, v, g, beta, state)
    return gated_delta_rule_ref(q, k, v, g, beta, state, return_all)


class GatedDeltaNet(nn.Module):
    """One linear-attention layer (``linear_attn``): in_proj_qkv, in_proj_gates ([b | a | z], one per value head),
    A_log, dt_bias, norm (per-head RMSNorm), out_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, 2 * self.hk * self.dk + self.hv * self.dv, bias=False)
        self.in_proj_gates = nn.Linear(cfg.hidden_size, 3 * self.hv, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, self.hv)))
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), self.hv))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))   # inverse softplus (Mamba2 init)
        self.norm = RMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.hv * self.dv, cfg.hidden_size, bias=False)

    @property
    def inputs_width(self) -> int:
        """Columns of the merged q|k|v|b|a|z projection (what ``inputs_out`` holds per token)."""
        return self.in_proj_qkv.out_features + self.in_proj_gates.out_features

    def project(self, x: torch.Tensor):
        """x [bs, T, hidden] -> (q, k [bs, T, Hv, dk] L2-normalised, v [bs, T, Hv, dv], g, beta, z [bs, T, Hv])."""
        bs, T, _ = x.shape
        qkv = self.in_proj_qkv(x)
        nq = self.hk * self.dk
        q = qkv[..., :nq].view(bs, T, self.hk, self.dk)
        k = qkv[..., nq:2 * nq].view(bs, T, self.hk, self.dk)
        v = qkv[..., 2 * nq:].view(bs, T, self.hv, self.dv)
        rep = self.hv // self.hk
        if rep > 1:  # grouped value attention: value head h reads key head h // rep (expand: no size sync)
            q = q[:, :, :, None].expand(bs, T, self.hk, rep, self.dk).reshape(bs, T, self.hv, self.dk)
            k = k[:, :, :, None].expand(bs, T, self.hk, rep, self.dk).reshape(bs, T, self.hv, self.dk)
        q = F.normalize(q.float(), dim=-1, eps=1e-6).to(v.dtype)  # v's dtype: under autocast x stays float32
        k = F.normalize(k.float(), dim=-1, eps=1e-6).to(v.dtype)
        b, a, z = self.in_proj_gates(x).float().chunk(3, -1)
        g = -self.A_log.float().exp() * F.softplus(a + self.dt_bias.float())
        return q, k, v, g, b.sigmoid(), z

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, return_all: bool = False,
                parents: torch.Tensor | None = None, fused: bool = False, state_out: torch.Tensor | None = None,
                state_rows: torch.Tensor | None = None, inputs_out: torch.Tensor | None = None):
        """x [bs, T, hidden], state [bs, Hv, dk, dv] float32 or None -> (out [bs, T, hidden], state(s) as
        ``gated_delta_rule`` returns them). With ``parents`` [bs, T] (a token tree): ``gated_delta_rule_tree``,
        the state after every token. ``fused``: the chain (decode, verify, draft) as models.fused.gdn_chain and the
        gated output norm as one kernel; a long prefill on CUDA (T > 1, one final state) keeps fla's chunked kernel,
        its inputs made in one node (models.fused.gdn_inputs; the eager ``project`` is ~25 host launches a layer).
        ``state_out``: where to put the returned state(s) (a slice of the model's stacked states; written by the
        kernel on the fused chain, copied otherwise). ``state_rows`` [bs]: ``state`` is the layer's whole pool
        [num_slots, Hv, dk, dv] and row b starts from state[state_rows[b]] (read in place on the fused chain).
        ``inputs_out`` [bs, T, ``inputs_width``] (fused only; the verify's): the merged q|k|v|b|a|z projection is
        written there and returned in place of the states, and no state is stored (the commit recomputes the
        accepted prefix's state from it: models.fused.gdn_recompute)."""
        bs, T, _ = x.shape
        if fused and parents is None:
            from .fused import gdn_chain, gdn_inputs, rms_norm
            from .layers import merged_weight
            # one GEMM for both projections (their outputs are read in place as two column ranges)
            w = merged_weight(self, "_qkv_gates", [self.in_proj_qkv, self.in_proj_gates])
            # F.linear without a bias is matmul(x, w.t()); with ``out`` the same GEMM writes the caller's buffer
            qg = F.linear(x, w) if inputs_out is None else torch.matmul(x, w.t(), out=inputs_out)
            qkv, gates = qg[..., :self.in_proj_qkv.out_features], qg[..., self.in_proj_qkv.out_features:]
            if inputs_out is not None:
                o, _ = gdn_chain(qkv, gates, self.A_log, self.dt_bias, self.hk, self.hv, self.dk, self.dv, state,
                                 False, None, state_rows, store_states=False)
                new_state = inputs_out
            elif return_all or T == 1 or _fla_chunk is None or not x.is_cuda:
                o, new_state = gdn_chain(qkv, gates, self.A_log, self.dt_bias, self.hk, self.hv,
                                         self.dk, self.dv, state, return_all, state_out, state_rows)
            else:  # a long prefill chunk: the inputs in one node, the recurrence in fla's chunked kernel
                if state is not None and state_rows is not None:
                    state = state[state_rows]
                o, new_state = gated_delta_rule_fla(*gdn_inputs(qkv, gates, self.A_log, self.dt_bias, self.hk,
                                                                self.hv, self.dk, self.dv), state)
                if state_out is not None:
                    new_state = state_out.copy_(new_state)
            o = rms_norm(o, self.norm.weight, self.norm.eps, gate=gates[..., 2 * self.hv:])
            return self.out_proj(o.reshape(bs, T, self.hv * self.dv)), new_state
        if state is not None and state_rows is not None:
            state = state[state_rows]
        q, k, v, g, beta, z = self.project(x)
        if parents is not None:
            o, new_state = gated_delta_rule_tree(q, k, v, g, beta, parents, state)
        else:
            o, new_state = gated_delta_rule(q, k, v, g, beta, state, return_all)
        o = self.norm(o) * z.sigmoid()[..., None].to(o.dtype)
        if state_out is not None:
            new_state = state_out.copy_(new_state)
        return self.out_proj(o.reshape(bs, T, self.hv * self.dv)), new_state
