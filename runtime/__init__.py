"""gaptrace.runtime: the block-speculative decoding runtime gaptrace diagnoses (DESIGN.md "The runtime"; seed 000).

Layout (gpt-fast's pure forward + nano-vllm's engine split):

    config.py        ModelConfig (HF names), RuntimeConfig (B, P, W, batch, chunk, scheduler), presets tiny / bench
    models/          the Qwen3-style hybrid decoder (GQA + gated delta rule, dense or MoE), HF checkpoints
    cache/           paged KV block manager, the draft window s(L), c(L) and its bound, linear-attention states
    spec/            device state, window rectangle (fixed / packed), draft block, verify, accept, commit,
                     prefill, plain greedy reference; tree.py: draft trees (DDTree: builders, tree verify,
                     path accept, KV compaction, draft refeed)
    tree.py          the draft-tree round's static buffers, CUDA graphs and phases (``--tree-budget N``)
    model_runner.py  both models, static buffers, CUDA graphs per batch bucket, pinned copies and events
    scheduler.py     sync (exact lengths on the host, three syncs a round) and overlap (Lplan bound, no sync)
    engine.py        the loop: admit, plan, round, read one round late
    plain.py         the target's plain greedy decoding in the same loop (one-token graphed step, no draft): the floor
    graphs.py        CUDA graph capture (keep_graph=True) and node counts
    annotate.py      NVTX range + record_function of one name
    faults.py        the switchable pathologies (--fault NAME), one function + one NVTX range each;
                     window_len_triton.py holds jit-new-shape's Triton kernel (imported on CUDA only)
    session.py, cli.py, tokenizer.py   `gaptrace decode`

Nothing here imports gaptrace.analyses; torch lives only in this package.
"""
