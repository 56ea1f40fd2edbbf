"""The presets: named model pairs with their runtime defaults (DESIGN.md "The runtime").

- ``tiny``: the shipped trained pair (a hybrid target of 8 layers, a 3-layer draft, one tokenizer), read from a
  preset directory holding ``tiny-target/``, ``tiny-draft/`` and ``tokenizer.json``: the repository's
  ``fixtures/models`` unless one is given (``get_preset(name, preset_dir)``, ``--preset-dir``). A package installed
  without the repository has no fixtures: then the tiny preset needs ``--preset-dir`` and says so in one line
  (:func:`check_preset_dir`; exit 2 on the command line). A directory that exists but holds no weights falls back
  to random init (said in the output's ``weights``).
- ``bench``: a 1.26B-parameter hybrid target and its draft, random weights, acceptance simulated on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import FULL, LINEAR, ConfigError, ModelConfig, RuntimeConfig

# the repository's copy of the tiny pair (present in a checkout and an editable install, not in a wheel)
DEFAULT_PRESET_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "models"
PRESET_NAMES = ("bench", "tiny")


@dataclass(frozen=True)
class Preset:
    """A named model pair: configs for random init, checkpoint dirs (used when they hold weights), runtime
    defaults, and whether acceptance is simulated (``bench``)."""

    name: str
    target: ModelConfig
    draft: ModelConfig
    target_dir: Path | None
    draft_dir: Path | None
    tokenizer: Path | None
    runtime: RuntimeConfig
    simulated: bool = False
    preset_dir: Path | None = None     # where the shipped pair is read from (None: the preset ships none)
    preset_dir_given: bool = False     # an explicit directory, not the repository's default


def tiny_target_config(vocab_size: int = 4096, eos_token_id: int | None = None) -> ModelConfig:
    """The shipped tiny target: hidden 384, 8 layers, linear : full = 3 : 1."""
    return ModelConfig(vocab_size=vocab_size, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                       layer_types=[FULL if i % 4 == 3 else LINEAR for i in range(8)], eos_token_id=eos_token_id)


def tiny_draft_config(vocab_size: int = 4096, eos_token_id: int | None = None) -> ModelConfig:
    """The shipped tiny draft: hidden 192, 3 full-attention layers, same tokenizer."""
    return ModelConfig(vocab_size=vocab_size, hidden_size=192, intermediate_size=576, num_hidden_layers=3,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=64, eos_token_id=eos_token_id)


def bench_target_config() -> ModelConfig:
    """A 1.26B-parameter hybrid target (hidden 2048, 24 layers, 18 linear + 6 full), random weights."""
    return ModelConfig(vocab_size=32768, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                       linear_num_key_heads=8, linear_num_value_heads=16,
                       layer_types=[FULL if i % 4 == 3 else LINEAR for i in range(24)], eos_token_id=None)


def bench_draft_config() -> ModelConfig:
    """The bench draft: hidden 1024, 2 full-attention layers."""
    return ModelConfig(vocab_size=32768, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=128, eos_token_id=None)


def get_preset(name: str, preset_dir: str | Path | None = None) -> Preset:
    """The preset called ``name`` (``PRESET_NAMES``); ConfigError naming the known ones otherwise. ``preset_dir``:
    the directory of the tiny pair (default: ``DEFAULT_PRESET_DIR``, the repository's fixtures/models); it is
    checked when the pair is loaded (:func:`check_preset_dir`), not here, so a preset used with ``--model-dir``
    needs none."""
    if name == "tiny":
        d = Path(preset_dir) if preset_dir is not None else DEFAULT_PRESET_DIR
        return Preset("tiny", tiny_target_config(), tiny_draft_config(), d / "tiny-target", d / "tiny-draft",
                      d / "tokenizer.json", RuntimeConfig(block_size=8, page_size=16, window=256, max_seq_len=2048),
                      preset_dir=d, preset_dir_given=preset_dir is not None)
    if name == "bench":
        return Preset("bench", bench_target_config(), bench_draft_config(), None, None, None,
                      RuntimeConfig(block_size=12, page_size=64, window=1024, max_seq_len=4096, prefill_chunk=512,
                                    dtype="bfloat16", sim_accept_rate=0.78),
                      simulated=True)
    raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESET_NAMES)})")


def check_preset_dir(p: Preset) -> None:
    """ConfigError (one line) when preset ``p`` ships a pair and its directory is missing: an explicit one is
    named as not found; the repository's default, missing from an installed package, says where to point
    ``--preset-dir``."""
    d = p.preset_dir
    if d is None or d.is_dir():
        return
    if p.preset_dir_given:
        raise ConfigError(f"{d}: preset directory not found (it should hold tiny-target/, tiny-draft/ and "
                          "tokenizer.json)")
    raise ConfigError(f"preset {p.name!r}: its model pair is not at {d} (this install has no repository fixtures): "
                      "give --preset-dir DIR, a copy of the repository's fixtures/models (tiny-target/, tiny-draft/, "
                      "tokenizer.json)")
