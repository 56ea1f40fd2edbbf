"""gaptrace.runtime: the block-speculative decoding runtime gaptrace diagnoses (DESIGN.md "The runtime").

Layout (gpt-fast's pure forward + nano-vllm's engine split):

    config.py        ModelConfig (HF names), RuntimeConfig (B, P, W, batch, chunk, scheduler, faults, tree)
    presets.py       the named pairs tiny / bench; the tiny pair's directory (--preset-dir)
    models/          the Qwen3-style hybrid decoder (GQA + gated delta rule, dense or MoE), RoPE, the fused Triton
                     kernels, HF checkpoints
    cache/           the device side of the paged KV cache, the draft window s(L), c(L) and its bound,
                     linear-attention states
    spec/            device state, window rectangle (fixed / packed), draft block, verify, accept, commit,
                     prefill, plain greedy reference; tree.py: draft trees (DDTree: builders, tree verify,
                     path accept, KV compaction, draft refeed)
    engine/          sequence.py (Request), block_manager.py (KV pages, host), scheduler.py (admission, the
                     host-only RoundPlan; sync / overlap), model_runner.py (both models, buffers, uploads, phases,
                     readbacks), graphs.py (CUDA graphs, node counts), rounds.py (the RoundStrategy protocol:
                     ChainRound, PlainRound), tree_round.py (TreeRound), hooks.py (the hook API: EngineHooks,
                     RoundEvent), engine.py (Engine / PlainEngine: schedule, run, postprocess)
    faults.py        the switchable pathologies (--fault NAME), one function + one NVTX range each, parsed once
                     into Faults (one switch per fault, the hooks the engine calls); window_len_triton.py holds
                     jit-new-shape's Triton kernel (imported on CUDA only)
    annotate.py      NVTX range + record_function of one name
    session.py       from options to a decode: models, tokenizer, config; the one config dictionary (run_config)
    cli.py           `gaptrace decode` / `gaptrace capture` (click); capture_run.py: the capture driver (hooks)
    tokenizer.py     HF tokenizer.json or bytes

Nothing here imports gaptrace.analyses; torch lives only in this package.
"""
