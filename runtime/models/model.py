"""The Qwen3-style hybrid decoder as a pure forward over tokens, positions and explicit cache views (gpt-fast).

    model(tokens)                              -> logits [bs, T, vocab]          plain causal forward (training)
    model(tokens, positions, cache)            -> (logits, linear states)        over a paged KV pool

Module names equal the Hugging Face tensor names (``model.layers.{i}.self_attn.q_proj.weight`` ...), so
``state_dict()`` is a Qwen3 / Llama checkpoint; linear-attention layers live under ``linear_attn``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import FULL, LINEAR, ModelConfig
from .gdn import GatedDeltaNet
from .layers import MLP, Attention, KVView, MoE, RMSNorm


@dataclass
class CacheView:
    """Everything a cached forward reads and writes, for all layers at once.

    k_pools / v_pools: one [num_token_slots, Hkv, D] tensor per full-attention layer (written in place).
    write_slots [bs, T], read_slots [bs, S], read_mask [bs, T, S]: see ``layers.KVView``.
    lin_state: [n_linear, bs, Hv, dk, dv] float32, the recurrent states before these tokens (None = zeros); with
    ``lin_rows`` [bs] the whole pool [n_linear, num_slots, Hv, dk, dv], row b's state at [:, lin_rows[b]].
    all_states: return the state after every token ([n_linear, bs, T, Hv, dk, dv]) instead of the final one.
    chain_inputs (fused only; the verify's): return every linear layer's merged q|k|v|b|a|z projection of these
    tokens ([n_linear, bs, T, width], the activation dtype) and store no state: the caller recomputes the state
    it keeps (models.fused.gdn_recompute) instead of the forward writing one per token.
    parents: the T tokens form a tree (draft-tree verify): token t's parent index (< t; -1 = the root, continuing
    from ``lin_state``); linear layers then run ``gdn.gated_delta_rule_tree`` and return every token's state.
    Full-attention layers get the tree through ``read_mask`` (ancestor-only) and ``positions`` (depth).
    fused: the fused path (``RuntimeConfig.kernels``): the kernels of ``models.fused`` (RMSNorm with the residual add
    or the output gate, q/k norm + RoPE with the K/V pool writes, attention from the pools, the gated-delta-rule
    chain, SwiGLU) and merged q|k|v and gate|up GEMMs (layers.py): one CUDA-graph node where eager runs a chain of
    ops; same arithmetic. Needs CUDA tensors and Triton. rope: see the field.
    """

    k_pools: list
    v_pools: list
    write_slots: torch.Tensor
    read_slots: torch.Tensor
    read_mask: torch.Tensor
    lin_state: torch.Tensor | None = None
    all_states: bool = False
    parents: torch.Tensor | None = None  # [bs, T] long: a token tree; linear layers return every state
    fused: bool = False  # the fused Triton kernels of models/fused.py (RuntimeConfig.kernels; CUDA + Triton only)
    lin_rows: torch.Tensor | None = None  # [bs]: lin_state is the whole pool (see above)
    rope: tuple | None = None  # fused: (cos, sin) [bs, T, D/2] of these positions made by the caller (a draft block's)
    chain_inputs: bool = False  # fused: return the linear layers' projections instead of states (see above)


def norm(mod: RMSNorm, x: torch.Tensor, fused: bool) -> torch.Tensor:
    """``mod(x)``, or the same RMSNorm as one fused kernel (models.fused.rms_norm)."""
    if not fused:
        return mod(x)
    from .fused import rms_norm
    return rms_norm(x, mod.weight, mod.eps)


def add_norm(mod: RMSNorm, h: torch.Tensor, residual: torch.Tensor | None, fused: bool):
    """(h + residual, mod(h + residual)) of a pre-norm block (no add when ``residual`` is None); fused: one kernel
    (models.fused.add_rms_norm, same roundings)."""
    if residual is None:
        return h, norm(mod, h, fused)
    if not fused:
        h = h + residual
        return h, mod(h)
    from .fused import add_rms_norm
    return add_rms_norm(h, residual, mod.weight, mod.eps)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + mixer(norm(x)), then x + mlp(norm(x)); mixer = self_attn or linear_attn."""

    def __init__(self, cfg: ModelConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if layer_type == FULL:
            self.self_attn = Attention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)
        self.mlp = MoE(cfg) if cfg.num_experts else MLP(cfg.hidden_size, cfg.intermediate_size)


class Backbone(nn.Module):
    """``model.*`` of a HF checkpoint: embed_tokens, layers, norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Transformer(nn.Module):
    """The decoder. ``Transformer(cfg)`` initialises random weights (normal, std 0.02; seeded by the caller).
    ``tp``: the tensor-parallel group of a rank's slice (runtime/tp/shard.py ``shard_target``); None: the whole
    model, in one process."""

    tp = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.full_layers = [i for i, t in enumerate(cfg.layer_types) if t == FULL]
        self.linear_layers = [i for i, t in enumerate(cfg.layer_types) if t == LINEAR]
        self._rope_inv_freq = None  # rope_inv_freq, made once on the weights' device (not a buffer: stays float32)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("embed_tokens.weight") or name.endswith("gate.weight") \
                    or name.endswith("gates.weight") or name.endswith("lm_head.weight"):
                nn.init.normal_(p, std=0.02)

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [bs, T, head_dim / 2] float32 of positions [bs, T] (``fused.rope_tables``), with inv_freq made
        once per model: a constant, so a CUDA graph holds no node that recomputes it on every replay."""
        from .rope import rope_inv_freq, rope_tables

        cfg = self.config
        if self._rope_inv_freq is None or self._rope_inv_freq.device != positions.device:
            self._rope_inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, positions.device)
        return rope_tables(positions, cfg.head_dim, cfg.rope_theta, self._rope_inv_freq)

    def linear_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every linear layer's (A_log, dt_bias), stacked: two [n_linear, Hv] tensors (made once, the layers'
        parameters re-pointed at their rows: layers.merged_parameters), for ``models.fused.gdn_recompute``."""
        from .layers import merged_parameters
        gdn = [self.model.layers[i].linear_attn for i in self.linear_layers]
        return (merged_parameters(self, "_A_log_all", [g.A_log for g in gdn], stack=True),
                merged_parameters(self, "_dt_bias_all", [g.dt_bias for g in gdn], stack=True))

    def logits(self, h: torch.Tensor, fused: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm and LM head: h [bs, T, hidden] (plus a pending ``residual``) -> [bs, T, vocab]."""
        _, h = add_norm(self.model.norm, h, residual, fused)
        w = self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return torch.nn.functional.linear(h, w)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache: CacheView | None = None,
                embeds: torch.Tensor | None = None):
        """tokens [bs, T] long; positions [bs, T] long (default 0..T-1); ``embeds`` [bs, T, hidden]: the tokens'
        embeddings already looked up (a draft step's, by ``fused.argmax_embed``), else ``embed_tokens(tokens)``.

        Without ``cache``: returns logits [bs, T, vocab] of a plain causal forward (training; on CUDA the
        linear layers use fla's chunked kernel). With ``cache``: full-attention layers write their K/V into the
        pools and attend over the masked gathered columns; linear layers continue from ``cache.lin_state``;
        returns (logits, states) where states is [n_linear, bs, Hv, dk, dv] (or per token with
        ``cache.all_states``; the linear layers' projections with ``cache.chain_inputs``), or None when the model
        has no linear layers.
        """
        bs, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(bs, T)
        fused = cache is not None and cache.fused
        rope = None
        if fused and self.full_layers:  # once per forward (or per draft block: cache.rope), for every attention layer
            rope = cache.rope if cache.rope is not None else self.rope_tables(positions)
        stacked = None  # fused: the layers write their states into one buffer (no stacking copy: ~100 MB a layer)
        inputs = fused and cache.chain_inputs and cache.parents is None
        if fused and self.linear_layers:
            g = self.model.layers[self.linear_layers[0]].linear_attn
            per_token = cache.all_states or cache.parents is not None
            if inputs:
                stacked = torch.empty((len(self.linear_layers), bs, T, g.inputs_width), device=tokens.device,
                                      dtype=self.model.embed_tokens.weight.dtype)
            else:
                stacked = torch.empty((len(self.linear_layers), bs) + ((T,) if per_token else ()) +
                                      (g.hv, g.dk, g.dv), device=tokens.device, dtype=torch.float32)
        h = self.model.embed_tokens(tokens) if embeds is None else embeds
        new_states, full_i, lin_i = [], 0, 0
        res = None  # the block output not yet added to the residual stream h (added inside the next norm)
        for layer in self.model.layers:
            h, x = add_norm(layer.input_layernorm, h, res, fused)
            if layer.layer_type == FULL:
                kv = None
                if cache is not None:
                    kv = KVView(cache.k_pools[full_i], cache.v_pools[full_i], cache.write_slots, cache.read_slots,
                                cache.read_mask)
                res = layer.self_attn(x, positions, kv, rope)
                full_i += 1
            else:
                state = None if cache is None or cache.lin_state is None else cache.lin_state[lin_i]
                out = None if stacked is None else stacked[lin_i]
                res, st = layer.linear_attn(x, state, cache is not None and cache.all_states,
                                            None if cache is None else cache.parents, fused,
                                            None if inputs else out, None if cache is None else cache.lin_rows,
                                            out if inputs else None)
                new_states.append(st)
                lin_i += 1
            h, x = add_norm(layer.post_attention_layernorm, h, res, fused)
            res = layer.mlp(x, fused)
        logits = self.logits(h, fused, res)
        if cache is None:
            return logits
        if stacked is not None:
            return logits, stacked
        return logits, (torch.stack(new_states) if new_states else None)
