"""A rank's slice of the target: Megatron-style column / row parallel layers (Shoeybi et al. 2019, "Megatron-LM",
section 3; DESIGN.md "Tensor parallelism").

In every decoder layer the weights that produce heads or MLP columns are split by rows (column parallel: each rank
computes its own heads / columns, no communication), and the weight that reads them back into the hidden size is
split by columns (row parallel: each rank's product is a partial sum, all-reduced). So there are two all-reduces a
layer, after the attention (or linear attention) and after the MLP, both in :class:`RowParallelLinear`:

| parameter (``model.layers.{i}.``)  | split                                            | kind   |
| ---------------------------------- | ------------------------------------------------ | ------ |
| ``self_attn.q_proj.weight``        | rows: query heads H / N                          | column |
| ``self_attn.k_proj / v_proj``      | rows: KV heads Hkv / N (their query groups stay) | column |
| ``self_attn.o_proj.weight``        | columns: H / N heads x D, then all-reduce        | row    |
| ``linear_attn.in_proj_qkv.weight`` | rows of each block q | k (hk / N heads) | v (hv / N) | column |
| ``linear_attn.in_proj_gates``      | rows of each block b | a | z (hv / N heads)    | column |
| ``linear_attn.A_log / dt_bias``    | hv / N heads                                     | column |
| ``linear_attn.out_proj.weight``    | columns: hv / N heads x dv, then all-reduce      | row    |
| ``mlp.gate_proj / up_proj``        | rows: intermediate / N                           | column |
| ``mlp.down_proj.weight``           | columns: intermediate / N, then all-reduce       | row    |

Everything else is replicated: the embedding, the LM head, every RMSNorm (the layer norms, q/k norm, the linear
attention's per-head output norm, whose weight is per dv element and shared by the heads), so every rank ends a
layer with the same hidden state and computes the same logits. Heads are split contiguously: rank r holds query
heads [r H/N, (r + 1) H/N) and KV heads [r Hkv/N, ...), which are the KV heads those query heads read (GQA maps
query head h to KV head h // (H / Hkv)); likewise linear value head h reads key head h // (hv / hk). Each rank's
KV cache and linear states then hold its own heads only (they are sized from the shard's config).
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from ..config import FULL, ConfigError, ModelConfig
from ..models.model import Transformer
from .group import TPGroup

_LAYER_PARAM = re.compile(r"^model\.layers\.\d+\.(.+)$")


def shard_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The config of one rank's slice: query heads, KV heads, intermediate size and (with linear layers) the linear
    key / value heads divided by ``world``. ConfigError (one line naming the field) when one does not divide, or
    for a mixture-of-experts target (its experts are not split)."""
    if world == 1:
        return cfg
    if cfg.num_experts:
        raise ConfigError(f"--tp {world}: the target has {cfg.num_experts} experts; tensor parallelism splits dense "
                          "MLPs only")
    fields = ["num_attention_heads", "num_key_value_heads", "intermediate_size"]
    if cfg.n_linear:
        fields += ["linear_num_key_heads", "linear_num_value_heads"]
    for f in fields:
        if getattr(cfg, f) % world:
            raise ConfigError(f"--tp {world}: the target's {f} {getattr(cfg, f)} does not split into {world} ranks")
    new = {f: getattr(cfg, f) // world for f in fields}
    if not cfg.n_linear:  # unused; kept consistent with the defaults they stand for
        new.update(linear_num_key_heads=new["num_key_value_heads"], linear_num_value_heads=new["num_attention_heads"])
    return ModelConfig(**{**dataclasses.asdict(cfg), **new})  # (replace() would re-apply the num_heads aliases)


def splits(cfg: ModelConfig) -> dict[str, tuple[int, list[int]]]:
    """{parameter name inside a layer: (dim, block sizes)} of the split parameters of a full ``cfg``: the
    parameter is cut along ``dim`` into blocks of those sizes, and a rank takes its contiguous 1/N of every block
    (:func:`shard_tensor`). Parameters not named are replicated. See the module docstring's table."""
    H, Hkv, D, I = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    return {
        "self_attn.q_proj.weight": (0, [H * D]),
        "self_attn.k_proj.weight": (0, [Hkv * D]),
        "self_attn.v_proj.weight": (0, [Hkv * D]),
        "self_attn.o_proj.weight": (1, [H * D]),
        "linear_attn.in_proj_qkv.weight": (0, [hk * dk, hk * dk, hv * dv]),
        "linear_attn.in_proj_gates.weight": (0, [hv, hv, hv]),
        "linear_attn.A_log": (0, [hv]),
        "linear_attn.dt_bias": (0, [hv]),
        "linear_attn.out_proj.weight": (1, [hv * dv]),
        "mlp.gate_proj.weight": (0, [I]),
        "mlp.up_proj.weight": (0, [I]),
        "mlp.down_proj.weight": (1, [I]),
    }


def shard_tensor(t: torch.Tensor, dim: int, blocks: list[int], rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``t``: cut along ``dim`` into ``blocks``, the rank's contiguous 1/``world`` of each
    block, concatenated in block order (a new contiguous tensor)."""
    return torch.cat([b.chunk(world, dim)[rank] for b in t.split(blocks, dim)], dim).contiguous()


class RowParallelLinear(nn.Linear):
    """A bias-free Linear whose input features are this rank's share: ``y = x W_r^T`` is a partial sum, all-reduced
    over the ranks (:meth:`TPGroup.all_reduce`), so every rank returns the full product. The weight keeps the name
    ``weight`` (the state dict is a slice of the target's)."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features / N] -> [..., out_features], summed over the ranks."""
        return self.tp.all_reduce(F.linear(x, self.weight))


def _row_parallel(parent: nn.Module, name: str, tp: TPGroup) -> None:
    old = getattr(parent, name)
    setattr(parent, name, RowParallelLinear(old.in_features, old.out_features, tp, device="meta"))


@torch.no_grad()
def shard_target(model: Transformer, tp: TPGroup) -> Transformer:
    """Rank ``tp.rank``'s slice of ``model``: a new Transformer with :func:`shard_config`'s config, every parameter
    on its source's device and in its dtype, in eval mode (``model`` is left as it was). Its ``tp`` is ``tp``; its
    attention output, linear-attention output and MLP down projections are :class:`RowParallelLinear`. With one
    rank, ``model`` itself. ConfigError as :func:`shard_config`."""
    if tp.world == 1:
        return model
    cfg = model.config
    with torch.device("meta"):
        out = Transformer(shard_config(cfg, tp.world))
    for layer in out.model.layers:
        if layer.layer_type == FULL:
            _row_parallel(layer.self_attn, "o_proj", tp)
        else:
            _row_parallel(layer.linear_attn, "out_proj", tp)
        _row_parallel(layer.mlp, "down_proj", tp)
    rules = splits(cfg)
    full = dict(model.named_parameters())
    for mod_name, mod in out.named_modules():
        for pname, p in list(mod._parameters.items()):
            if p is None:  # a bias-free Linear's bias slot
                continue
            name = f"{mod_name}.{pname}" if mod_name else pname
            src = full[name]
            m = _LAYER_PARAM.match(name)
            rule = rules.get(m.group(1)) if m else None
            # the source's own device and dtype (a float32 A_log stays float32 beside bfloat16 weights)
            t = src.detach().clone() if rule is None else shard_tensor(src.detach(), rule[0], rule[1], tp.rank,
                                                                        tp.world)
            mod._parameters[pname] = nn.Parameter(t, requires_grad=src.requires_grad)
    out.tp = tp
    return out.eval()
