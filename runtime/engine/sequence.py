"""A request: its prompt, its limits, what it has produced, and the host's (possibly one round stale) view of
its committed length. A plain record, like nano-vllm's sequence.py."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    """One generation request. ``committed_len`` is what the host knows of L (prompt + tau of every round read so
    far); the device may be up to one block ahead (DESIGN.md "The plan bound": Lplan = Lcommitted + B >= L)."""

    rid: int
    prompt: list
    max_new_tokens: int
    eos_token_id: int | None = None
    output: list = field(default_factory=list)
    slot: int | None = None
    committed_len: int = 0
    rounds: int = 0
    accepted: int = 0          # sum of tau over the rounds this request was live in
    finished: bool = False
    finish_reason: str = ""

    def append(self, tokens) -> bool:
        """Append emitted tokens up to EOS (kept) or max_new_tokens; True when the request is now finished."""
        for t in tokens:
            self.output.append(int(t))
            if self.eos_token_id is not None and int(t) == self.eos_token_id:
                self.finished, self.finish_reason = True, "eos"
                break
            if len(self.output) >= self.max_new_tokens:
                self.finished, self.finish_reason = True, "length"
                break
        return self.finished
