"""The engine (nano-vllm's engine/): the request record, the block manager, the scheduler, the model runner, the
CUDA graphs, the round strategies, and the loop that joins them.

    sequence.py       Request: a prompt, its limits, its output, the host's view of its committed length
    block_manager.py  BlockManager: KV pages per request slot (host); the scheduler owns it
    scheduler.py      Batch, RoundPlan (host only), sync / overlap schedulers: admission, buckets, pages, sizing
    model_runner.py   ModelRunner: both models, device state, static buffers, uploads, phases; Readback
    graphs.py         CUDA graph capture (keep_graph=True), node counts, batch buckets
    rounds.py         RoundStrategy protocol; ChainRound (block-speculative), PlainRound (no draft)
    tree_round.py     TreeRound: the draft-tree round (``--tree-budget N``)
    hooks.py          EngineHooks (on_prefill, on_round, on_round_read, on_tokens), RoundEvent, CallbackHooks
    engine.py         Engine, PlainEngine: schedule, run, postprocess; DecodeStats, check_request
"""
from .engine import DecodeStats, Engine, PlainEngine, RequestError, check_request
from .hooks import CallbackHooks, EngineHooks, RoundEvent

__all__ = ["CallbackHooks", "DecodeStats", "Engine", "EngineHooks", "PlainEngine", "RequestError", "RoundEvent",
           "check_request"]
