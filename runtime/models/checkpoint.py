"""Hugging Face-format checkpoint directories: ``config.json`` + ``*.safetensors`` (one file or shards).

Tensor names are the HF Qwen3 / Llama / Qwen3-MoE ones (``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.q_proj.weight``, ``model.layers.{i}.mlp.gate_proj.weight``, ``model.norm.weight``,
``lm_head.weight`` unless tied); this runtime's linear-attention layers add ``model.layers.{i}.linear_attn.*``.
Nothing is fetched from a hub. Every problem raises ``CheckpointError`` (a ValueError) with one line naming the
directory or file and the tensor.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from ..config import ConfigError, ModelConfig
from .model import Transformer

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older Llama checkpoints carry


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; one line naming the file and the problem."""


def save_checkpoint(model: Transformer, cfg: ModelConfig, directory: str | os.PathLike,
                    max_shard_bytes: int | None = None) -> Path:
    """Write ``config.json`` and the tensors (in the model's dtype) into ``directory``, Hugging Face style:
    ``model.safetensors``, or with ``max_shard_bytes`` the shards ``model-0000i-of-0000n.safetensors`` plus
    ``model.safetensors.index.json`` (transformers' sharded layout; shards are filled in state-dict order).

    Files are written under temporary names and renamed, so a reader never sees half a checkpoint; they are
    world-readable (0644) like any checked-in file. Returns the directory.
    """
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    cfg_dict = cfg.to_hf_dict()
    cfg_dict["torch_dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    shards: list[dict] = [{}]
    size = 0
    for k, v in tensors.items():
        nbytes = v.numel() * v.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nbytes
    files: dict[str, object] = {}
    if len(shards) == 1:
        files["model.safetensors"] = lambda p: save_file(tensors, str(p), metadata={"format": "pt"})
    else:
        n = len(shards)
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{n:05d}.safetensors"
            weight_map.update({k: name for k in shard})
            files[name] = (lambda sh: lambda p: save_file(sh, str(p), metadata={"format": "pt"}))(shard)
        index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in tensors.values())},
                 "weight_map": weight_map}
        files["model.safetensors.index.json"] = lambda p: p.write_text(json.dumps(index, indent=2) + "\n")
    files["config.json"] = lambda p: p.write_text(json.dumps(cfg_dict, indent=2) + "\n")
    for stale in out.glob("model*.safetensors*"):  # a re-save must not leave shards of another layout behind
        if stale.name not in files:
            stale.unlink()
    for name, write in files.items():
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        os.close(fd)
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return out


def read_config(directory: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a checkpoint directory (CheckpointError if config.json is missing or bad)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json (expected a Hugging Face checkpoint directory)")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    except (UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: not a JSON object (a Hugging Face config.json maps field names to values)")
    try:
        return ModelConfig.from_hf_dict(d, source=str(path))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def read_tensors(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of the directory's ``*.safetensors`` files, by name (CPU)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{f}: unreadable safetensors file ({str(e).splitlines()[0]})") from None
    return tensors


def load_checkpoint(directory: str | os.PathLike, device="cpu", dtype: torch.dtype = torch.float32) -> Transformer:
    """Load a checkpoint directory into a ``Transformer`` on ``device`` in ``dtype``; its config is
    ``model.config``. Raises CheckpointError on a missing directory/config/tensor, a tensor of the wrong shape,
    a tensor that is not floating-point or holds NaN/inf, or an unexpected tensor."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: checkpoint directory not found")
    cfg = read_config(directory)
    tensors = read_tensors(directory)
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # tied checkpoints sometimes store the copy
    for name, t in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{directory}: missing tensor {name} {list(t.shape)}")
        if tuple(tensors[name].shape) != tuple(t.shape):
            raise CheckpointError(f"{directory}: tensor {name} has shape {list(tensors[name].shape)}, "
                                  f"expected {list(t.shape)}")
        if not tensors[name].is_floating_point():  # an int8/bool tensor would be cast to garbage weights silently
            dtype_name = str(tensors[name].dtype).removeprefix("torch.")
            raise CheckpointError(f"{directory}: tensor {name} has dtype {dtype_name}, expected a floating-point dtype")
        bad = int((~torch.isfinite(tensors[name])).sum())
        if bad:
            raise CheckpointError(f"{directory}: tensor {name} holds {bad} NaN or infinite values")
    extra = sorted(k for k in tensors if k not in expected and not k.endswith(IGNORED_SUFFIXES))
    if extra:
        raise CheckpointError(f"{directory}: unexpected tensor {extra[0]} (and {len(extra) - 1} more); "
                              f"config.json does not describe these weights")
    model = model.to_empty(device=device)
    model.load_state_dict({k: tensors[k] for k in expected}, strict=True)
    model.config = cfg
    return model.to(dtype=dtype)
