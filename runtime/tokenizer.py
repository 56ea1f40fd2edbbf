"""Text <-> token ids: a Hugging Face ``tokenizers`` file (fixtures/models/tokenizer.json, or a checkpoint's
own), or a byte-level fallback (ids 0-255 are the bytes) for random-weight presets."""
from __future__ import annotations

from pathlib import Path

EOS_TOKENS = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>")


class ByteTokenizer:
    """UTF-8 bytes as ids; ids >= 256 decode to U+FFFD. No EOS."""

    eos_token_id = None
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return b"".join(bytes([i]) if 0 <= i < 256 else "\ufffd".encode() for i in ids).decode("utf-8", "replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from a tokenizer.json; EOS is the first of EOS_TOKENS it knows."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))
        self.name = str(path)
        self.eos_token_id = next((i for t in EOS_TOKENS if (i := self.tok.token_to_id(t)) is not None), None)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


def load_tokenizer(*candidates: Path | None, vocab_size: int | None = None):
    """The first existing tokenizer.json among ``candidates`` (whose vocabulary fits ``vocab_size``), else bytes."""
    for c in candidates:
        if c is not None and Path(c).is_file():
            tok = HFTokenizer(Path(c))
            if vocab_size is None or tok.tok.get_vocab_size() <= vocab_size:
                return tok
    return ByteTokenizer()
