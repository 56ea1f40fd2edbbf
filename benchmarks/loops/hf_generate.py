"""A Hugging Face ``transformers`` ``generate`` loop with a host-side LogitsProcessor.

The model is a small ``LlamaForCausalLM`` made from a ``LlamaConfig`` with random weights (no download); greedy
decoding of ``batch`` sequences with the default dynamic KV cache. A LogitsProcessor bans a fixed set of token ids
(a bad-words list) every step.

* planted (``planted_logits_processor``): the processor does it on the host: ``scores.cpu()`` (a device-to-host
  copy of the [batch, vocab] scores and a sync), a Python loop writing -inf into each banned column
  (``host[:, t] = -inf``, one small tensor op per banned id), and ``.to(device)`` back (a pageable copy).
* fixed: ``scores.masked_fill(mask, -inf)`` with a boolean vocab mask made once on the device.

Expected saving (an estimate, before measurement): the Python loop's 256 tensor writes (~4-6 µs each on a server
host: ~1-1.5 ms) plus the two copies and the sync, out of a generate step of a few ms (transformers' per-step Python
around 4 eager decoder layers): the planted step should be roughly 1.2-1.6x the fixed one.

Size key ``cudnn_sdp`` (1 by default: torch picks the attention backend): 0 runs ``generate`` with cuDNN excluded
from scaled_dot_product_attention's backends (``torch.nn.attention.sdpa_kernel``, the rest kept). On torch 2.11 with
an H100 or H200 the default picks cuDNN attention, whose host side builds a new cuDNN graph for every new key
length: ~8 ms of host time a layer a decode step once the sequence outgrows the first few dozen tokens (the 4 ms
step of the warm-up becomes 40 ms). 0 is that fix, measured against what ``gaptrace analyze`` predicts for it
(its first finding, ``sdpa_attention_forward``'s host work), and the stationary loop the planted pair is measured on.

One generate call runs all the steps. A step is one call of the model's forward plus what generate does after it
(processors, argmax, stopping criteria) until the next forward: a forward pre-hook closes the previous ``step``
range, calls ``tick`` and opens the next one. The first step of a call is the prefill; the driver's warm-up covers
it (it runs its own generate call first) and the measured call's prefill is its step 0.
"""
from __future__ import annotations

import torch

from ._common import Loop, site, step_range

NAME = "hf_generate"
CAUSE = "LogitsProcessor copies the scores to the host and bans ids in a Python loop every step"
FIX = "the same ban as a device-side masked_fill with a precomputed mask"
SITE = "planted_logits_processor"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.2, 1.6)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 1, "hidden": 512, "layers": 4, "heads": 8, "kv_heads": 4, "vocab": 32000, "prompt": 16,
             "banned": 256, "cudnn_sdp": 1}
CPU_SIZE = {"batch": 1, "hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "vocab": 256, "prompt": 4,
            "banned": 8, "cudnn_sdp": 1}


def _processors(variant: str, banned: list[int], vocab: int, device: torch.device):
    from transformers import LogitsProcessor

    class HostBanList(LogitsProcessor):
        """Bans ``banned`` on a host copy of the scores, one column at a time (the planted cause)."""

        def __call__(self, input_ids, scores):
            with site(SITE):
                host = scores.cpu()  # SYNC (planted): D2H copy of [batch, vocab]
                for t in banned:
                    host[:, t] = float("-inf")
                return host.to(scores.device)

    class DeviceBanList(LogitsProcessor):
        """Bans ``banned`` with one masked_fill on the device (the fix)."""

        def __init__(self):
            self.mask = torch.zeros(vocab, dtype=torch.bool, device=device)
            self.mask[banned] = True

        def __call__(self, input_ids, scores):
            with site(SITE):
                return scores.masked_fill(self.mask, float("-inf"))

    return HostBanList() if variant == "planted" else DeviceBanList()


class HFGenerate(Loop):
    """See the module docstring; ``size`` keys: batch, hidden, layers, heads, kv_heads, vocab, prompt, banned."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=sz["hidden"], intermediate_size=2 * sz["hidden"],
                          num_hidden_layers=sz["layers"], num_attention_heads=sz["heads"],
                          num_key_value_heads=sz["kv_heads"], vocab_size=sz["vocab"], max_position_embeddings=8192,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
        g = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(3, sz["vocab"], (sz["batch"], sz["prompt"]), generator=g).to(device)
        # the config's eos id is banned too (and generate is told there is none), so every call runs its full length
        banned = [cfg.eos_token_id] + torch.randperm(sz["vocab"] - 3, generator=g)[: sz["banned"] - 1].add(3).tolist()
        self.processors = LogitsProcessorList([_processors(variant, banned, sz["vocab"], device)])
        self.cudnn_sdp = bool(sz.get("cudnn_sdp", 1))
        self._tick = None
        self._range = None
        self.forwards = 0
        self.model.register_forward_pre_hook(self._pre_forward)

    def _pre_forward(self, module, args):
        self.forwards += 1
        self._close()
        if self._tick is not None:
            self._tick()
        self._range = step_range()
        self._range.__enter__()

    def _close(self) -> None:
        if self._range is not None:
            r, self._range = self._range, None
            r.__exit__(None, None, None)

    def run(self, n_steps, tick) -> None:
        """One ``generate`` call of exactly ``n_steps`` forwards (prefill + n_steps - 1 decode steps)."""
        self._tick = tick
        self.forwards = 0
        try:
            with torch.inference_mode(), self._backends():
                self.model.generate(self.prompt, attention_mask=torch.ones_like(self.prompt), do_sample=False,
                                    max_new_tokens=n_steps, eos_token_id=None,
                                    pad_token_id=0, logits_processor=self.processors)
        finally:
            self._close()
            self._tick = None
        if self.forwards != n_steps:
            raise RuntimeError(f"generate ran {self.forwards} forwards, not the {n_steps} asked for")
        tick()

    def _backends(self):
        """The attention backends of the run: torch's choice, or all but cuDNN (size key ``cudnn_sdp`` 0)."""
        import contextlib

        if self.cudnn_sdp:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def step(self) -> None:
        """One generate call of a single forward (a prefill); ``run`` is how the steps are driven."""
        self.run(1, lambda: None)


def build(variant: str, device: torch.device, size: dict | None = None) -> HFGenerate:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return HFGenerate(variant, device, size)
