"""Configuration of the runtime: the model (HF/Qwen3 field names), the decode loop, and the presets.

``ModelConfig`` mirrors a Hugging Face ``config.json`` (Qwen3 / Llama / Qwen3-MoE names; the hybrid's
linear-attention fields follow Qwen3-Next). ``RuntimeConfig`` holds the decode-loop knobs of DESIGN.md "The
runtime": page size P, draft window W, block size B, batch size, chunked prefill, scheduler. Every check raises
``ConfigError`` (a ValueError) with one line naming the field and the problem. The named model pairs (tiny,
bench) are presets.py's.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import InitVar, dataclass, field

FULL, LINEAR = "full_attention", "linear_attention"
# the switchable pathologies of runtime/faults.py (one function each, named with "_" for "-")
FAULT_NAMES = ("lengths-copy", "dd-gather", "eager-commit-glue", "jit-new-shape", "token-list-rebuild",
               "cpu-tree-build", "late-rank")
TREE_FAULTS = ("cpu-tree-build",)  # faults of the draft-tree round only (they need tree mode: tree_budget > 0)
TP_FAULTS = ("late-rank",)  # faults of a tensor-parallel decode only (they need tensor_parallel >= 2)
TREE_BUILDERS = ("gpu", "cpu-heapq")
KERNELS = ("auto", "fused", "eager")
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")  # float64: CPU only (the exactness tests' dtype)


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the field and what is wrong."""


@dataclass
class ModelConfig:
    """A Qwen3-style decoder: RMSNorm, RoPE, GQA (optional q/k RMSNorm), SwiGLU or top-k MoE, and optional
    gated-delta-rule linear-attention layers (``layer_types``).

    ``num_layers`` / ``num_heads`` / ``num_kv_heads`` are accepted as constructor aliases (and read-only
    properties) of the HF names. Linear-attention head counts/dims of 0 mean: key heads = num_key_value_heads,
    value heads = num_attention_heads, both dims = head_dim. ``num_experts`` 0 = dense MLP.
    """

    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    qk_norm: bool = True  # Qwen3 normalises q and k per head; Llama does not
    layer_types: list = field(default_factory=list)  # [] = all full attention
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    max_position_embeddings: int = 4096
    eos_token_id: int | None = None
    model_type: str = ""
    num_layers: InitVar[int | None] = None
    num_heads: InitVar[int | None] = None
    num_kv_heads: InitVar[int | None] = None

    def __post_init__(self, num_layers, num_heads, num_kv_heads):
        if num_layers is not None:
            self.num_hidden_layers = num_layers
        if num_heads is not None:
            self.num_attention_heads = num_heads
        if num_kv_heads is not None:
            self.num_key_value_heads = num_kv_heads
        self.layer_types = list(self.layer_types) or [FULL] * self.num_hidden_layers
        self.linear_num_key_heads = self.linear_num_key_heads or self.num_key_value_heads
        self.linear_num_value_heads = self.linear_num_value_heads or self.num_attention_heads
        self.linear_key_head_dim = self.linear_key_head_dim or self.head_dim
        self.linear_value_head_dim = self.linear_value_head_dim or self.head_dim
        if not self.model_type:
            self.model_type = ("gaptrace_hybrid" if LINEAR in self.layer_types
                               else "qwen3_moe" if self.num_experts else "qwen3" if self.qk_norm else "llama")
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError on the first inconsistent field."""
        def need(ok: bool, msg: str):
            if not ok:
                raise ConfigError(f"model config: {msg}")
        for f in dataclasses.fields(self):  # a config.json is untrusted: "big", [4], null or true where a number goes
            v = getattr(self, f.name)
            if f.type == "int":
                need(isinstance(v, int) and not isinstance(v, bool), f"{f.name} must be an integer, got {v!r}")
            elif f.type == "float":
                need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                     f"{f.name} must be a finite number >= 0, got {v!r}")
            elif f.type == "bool":
                need(isinstance(v, bool), f"{f.name} must be true or false, got {v!r}")
        eos = self.eos_token_id
        need(eos is None or (isinstance(eos, int) and not isinstance(eos, bool)),
             f"eos_token_id must be an integer, got {eos!r}")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            need(int(getattr(self, name)) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(len(self.layer_types) == self.num_hidden_layers,
             f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = sorted(set(self.layer_types) - {FULL, LINEAR})
        need(not bad, f"unknown layer type {bad[0] if bad else ''!r} (expected {FULL!r} or {LINEAR!r})")
        need(self.num_attention_heads % self.num_key_value_heads == 0,
             f"num_attention_heads {self.num_attention_heads} not a multiple of num_key_value_heads "
             f"{self.num_key_value_heads}")
        need(self.linear_num_value_heads % self.linear_num_key_heads == 0,
             f"linear_num_value_heads {self.linear_num_value_heads} not a multiple of linear_num_key_heads "
             f"{self.linear_num_key_heads}")
        need(self.head_dim % 2 == 0, f"head_dim {self.head_dim} must be even (RoPE)")
        if self.num_experts:
            need(0 < self.num_experts_per_tok <= self.num_experts,
                 f"num_experts_per_tok {self.num_experts_per_tok} not in [1, num_experts={self.num_experts}]")
            need(self.moe_intermediate_size >= 1, "moe_intermediate_size must be >= 1 with experts")
        if self.eos_token_id is not None:
            need(0 <= self.eos_token_id < self.vocab_size, f"eos_token_id {self.eos_token_id} outside the vocabulary")

    @property
    def n_linear(self) -> int:
        """Number of linear-attention (gated delta rule) layers."""
        return self.layer_types.count(LINEAR)

    def to_hf_dict(self) -> dict:
        """The config.json dictionary (HF names)."""
        return {"architectures": ["GaptraceForCausalLM"], **dataclasses.asdict(self)}

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        """Build from a HF config.json dict (Qwen3, Llama, Qwen3-MoE, or this runtime's own); unknown keys are
        ignored. Raises ConfigError naming ``source`` on a missing or bad field."""
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        mt = d.get("model_type", "")
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if "qk_norm" not in d:
            kw["qk_norm"] = mt.startswith("qwen3") or mt == "gaptrace_hybrid"
        if "num_key_value_heads" not in d and "num_attention_heads" in d:
            kw["num_key_value_heads"] = d["num_attention_heads"]
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        try:
            return cls(**kw)
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"{source}: {str(e).removeprefix('model config: ')}") from None


for _alias, _hf in (("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
                    ("num_kv_heads", "num_key_value_heads")):
    setattr(ModelConfig, _alias, property(lambda self, _hf=_hf: getattr(self, _hf)))


@dataclass
class RuntimeConfig:
    """The decode loop (DESIGN.md "The runtime"): page size P, draft window W (a multiple of P),
    block size B (tokens per request per verify round), the number of request slots, the context capacity
    ``max_seq_len`` per slot, the prefill chunk, the scheduler (``sync`` | ``overlap``), CUDA graphs on/off, and
    ``sim_accept_rate`` (bench only: acceptance simulated on the device, each drafted token accepted with this
    probability, instead of comparing with the target), and ``faults``: the pathologies of runtime/faults.py switched
    on (names from ``FAULT_NAMES``; ``lengths-copy`` and ``dd-gather`` only on top of ``overlap``, since ``sync``
    already does both; ``cpu-tree-build`` only in tree mode).

    Draft trees (DDTree; DESIGN.md "Draft trees"): ``tree_budget`` N > 0 switches tree mode on: each round verifies
    a best-first tree of N nodes per request (the root, i.e. the pending token, included: N is the verify width,
    the chain's B), built from the draft's top-``tree_topk`` tokens at each of the B - 1 draft positions (so tree
    depth <= B - 1 and tau <= B, as in the chain). ``tree_builder``: ``gpu`` (batched, fixed shapes, no host sync)
    or ``cpu-heapq`` (per request on the host, Python heapq; the CPU tree-build pathology, the same as the fault
    ``cpu-tree-build``). Both build the same tree (runtime/spec/tree.py).

    ``kernels``: ``fused`` runs the cached forward's RMSNorms, q/k norm + RoPE and gated-delta-rule chain as the
    Triton kernels of runtime/models/fused.py (CUDA + Triton only: fewer, larger CUDA-graph nodes);
    ``eager`` as chains of PyTorch ops; ``auto`` (default) = fused where it can run, eager otherwise.

    ``tensor_parallel`` N (DESIGN.md "Tensor parallelism"): the target split over N ranks, one process each
    (runtime/tp/: ``spawn_ranks``, ``shard_target``); 1 = one process, no process group. ``late_rank_ms``: the host
    delay the fault ``late-rank`` adds to the last rank's planning each round (runtime/faults.py)."""

    block_size: int = 8
    page_size: int = 16
    window: int = 256
    batch_size: int = 8
    max_seq_len: int = 1024
    prefill_chunk: int = 128
    scheduler: str = "overlap"
    device: str = "cpu"
    dtype: str = "float32"
    cuda_graphs: bool = True
    # "max": one batch bucket (batch_size; smaller batches pad to it), "pow2": every power of two below it too.
    # None: "max", or "pow2" under the fault jit-new-shape (a round in a new bucket mid-decode: it needs more than
    # one; "max" with it is an error). See graph_bucket_mode. One bucket keeps the process at 3 CUDA graphs: past ~4 graphs + streams with work, every graph node of the
    # process costs ~0.18 µs more on an H200 (DESIGN.md "Graph-node bubbles")
    graph_buckets: str | None = None
    sim_accept_rate: float | None = None
    seed: int = 0
    faults: tuple = ()
    tree_budget: int = 0
    tree_topk: int = 4
    tree_builder: str = "gpu"
    kernels: str = "auto"
    tensor_parallel: int = 1
    late_rank_ms: float = 20.0

    def __post_init__(self):
        self.faults = tuple(dict.fromkeys(self.faults))  # repeated names switch a fault on once
        if self.tree_builder == "cpu-heapq":  # the CPU builder IS the fault cpu-tree-build: one switch, two spellings
            self.faults = tuple(dict.fromkeys(self.faults + ("cpu-tree-build",)))
        if "cpu-tree-build" in self.faults:
            self.tree_builder = "cpu-heapq"
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError on the first bad value."""
        def need(ok: bool, msg: str):
            if not ok:
                raise ConfigError(msg)
        need(self.block_size >= 1, f"block size B must be >= 1, got {self.block_size}")
        need(self.page_size >= 1, f"page size P must be >= 1, got {self.page_size}")
        need(self.window >= self.page_size and self.window % self.page_size == 0,
             f"draft window W={self.window} must be a positive multiple of the page size P={self.page_size}")
        need(self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}")
        need(self.prefill_chunk >= 1, f"prefill chunk must be >= 1, got {self.prefill_chunk}")
        need(self.max_seq_len % self.page_size == 0,
             f"max_seq_len {self.max_seq_len} must be a multiple of the page size P={self.page_size}")
        need(self.graph_buckets in (None, "max", "pow2"),
             f"unknown graph buckets {self.graph_buckets!r} (max | pow2)")
        need(self.graph_buckets != "max" or "jit-new-shape" not in self.faults,
             "fault 'jit-new-shape' (a round in a new batch bucket) needs --graph-buckets pow2, not max")
        need(self.scheduler in ("sync", "overlap"), f"unknown scheduler {self.scheduler!r} (sync | overlap)")
        need(self.device in ("cpu", "cuda"), f"unknown device {self.device!r} (cpu | cuda)")
        need(self.dtype in DTYPE_NAMES, f"unknown dtype {self.dtype!r} ({' | '.join(DTYPE_NAMES)})")
        need(self.dtype != "float64" or self.device == "cpu", "--dtype float64 runs on the CPU only")
        need(isinstance(self.tensor_parallel, int) and not isinstance(self.tensor_parallel, bool)
             and self.tensor_parallel >= 1, f"--tp must be an integer >= 1, got {self.tensor_parallel!r}")
        need(isinstance(self.late_rank_ms, (int, float)) and not isinstance(self.late_rank_ms, bool)
             and math.isfinite(self.late_rank_ms)
             and self.late_rank_ms > 0, f"late-rank delay must be a number of ms > 0, got {self.late_rank_ms!r}")
        need(self.sim_accept_rate is None or 0.0 <= self.sim_accept_rate <= 1.0,
             f"sim_accept_rate {self.sim_accept_rate} outside [0, 1]")
        need(isinstance(self.tree_budget, int) and self.tree_budget >= 0,
             f"tree budget must be an integer >= 0 (0 = chain), got {self.tree_budget!r}")
        need(isinstance(self.tree_topk, int) and self.tree_topk >= 1,
             f"tree top-k must be >= 1, got {self.tree_topk!r}")
        need(self.tree_builder in TREE_BUILDERS,
             f"unknown tree builder {self.tree_builder!r} ({' | '.join(TREE_BUILDERS)})")
        need(not self.tree_budget or self.sim_accept_rate is None,
             "tree mode needs real acceptance: sim_accept_rate (the bench preset's simulated acceptance) is set")
        need(self.kernels in KERNELS, f"unknown kernels {self.kernels!r} ({' | '.join(KERNELS)})")
        need(self.kernels != "fused" or (self.device == "cuda" and triton_available()),
             "--kernels fused needs --device cuda and Triton installed (use auto or eager)")
        for f in self.faults:
            need(f in FAULT_NAMES, f"unknown fault {f!r} (known: {', '.join(FAULT_NAMES)})")
            need(self.scheduler == "overlap" or f not in ("lengths-copy", "dd-gather"),
                 f"fault {f!r} needs --scheduler overlap (the sync scheduler already does it)")
            need(self.tree_budget > 0 or f not in TREE_FAULTS,
                 f"fault {f!r} (--tree-builder cpu-heapq) needs tree mode (--tree-budget N): a chain builds no tree")
            need(self.tensor_parallel >= 2 or f not in TP_FAULTS,
                 f"fault {f!r} delays one rank of several: it needs --tp 2 or more")

    @property
    def graph_bucket_mode(self) -> str:
        """The batch buckets that get graphs: ``graph_buckets``, or when None "pow2" under the fault jit-new-shape
        and "max" otherwise."""
        if self.graph_buckets is not None:
            return self.graph_buckets
        return "pow2" if "jit-new-shape" in self.faults else "max"

    @property
    def fused_kernels(self) -> bool:
        """Whether the cached forward runs the fused kernels: ``kernels`` resolved (auto = CUDA with Triton)."""
        return self.kernels == "fused" or (self.kernels == "auto" and self.device == "cuda" and triton_available())

    @property
    def tree(self) -> bool:
        """Tree mode (``tree_budget`` > 0)."""
        return self.tree_budget > 0

    @property
    def cpu_tree_build(self) -> bool:
        """The tree is built on the host with heapq: ``tree_builder`` cpu-heapq, i.e. the fault ``cpu-tree-build``
        (either switch sets the other)."""
        return self.tree and self.tree_builder == "cpu-heapq"

    @property
    def verify_width(self) -> int:
        """Tokens verified per request per round: B (chain) or the tree budget N."""
        return self.tree_budget or self.block_size

    @property
    def round_span(self) -> int:
        """Positions past the committed length L one round writes: max(B, N) (the draft block writes B, a tree's
        verify N; the tree's nodes sit at token slots L .. L + N - 1 before the accepted path is compacted)."""
        return max(self.block_size, self.tree_budget)

    def replace(self, **kw) -> "RuntimeConfig":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **kw)


def triton_available() -> bool:
    """True when Triton can be imported (it ships with CUDA builds of torch; absent from CPU machines)."""
    import importlib.util
    return importlib.util.find_spec("triton") is not None
