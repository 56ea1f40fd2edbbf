"""The network: a Qwen3-style hybrid decoder (full attention + gated-delta-rule linear attention, dense or MoE).

Contract (stable; scripts/train_pair.py and the runtime rely on it)::

    from gaptrace.runtime.config import ModelConfig            # HF / Qwen3 field names; num_layers, num_heads,
                                                               # num_kv_heads accepted as aliases
    from gaptrace.runtime.models.model import Transformer
    model = Transformer(cfg)                                   # random init (seed with torch.manual_seed)
    logits = model(tokens)                                     # tokens [bs, T] long -> [bs, T, vocab]: plain
                                                               # causal forward (training; fla on CUDA)
    logits, states = model(tokens, positions, cache)           # cached forward over a paged KV pool (CacheView)
    from gaptrace.runtime.models.checkpoint import save_checkpoint, load_checkpoint
    save_checkpoint(model, cfg, "dir")                         # config.json + model.safetensors (HF names)
    model = load_checkpoint("dir", device, dtype)              # config at model.config; CheckpointError if bad

Files: rope.py (RoPE: angles, eager rotation, the fused kernels' tables), layers.py (RMSNorm, GQA attention over
gathered KV, SwiGLU, MoE), gdn.py (gated delta rule: reference recurrence + fla kernel), fused.py (Triton kernels
of the cached forward), model.py (the decoder), checkpoint.py (HF directories). Imports point one way: model ->
layers / gdn -> fused -> rope.
"""
