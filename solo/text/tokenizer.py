"""A byte-level tokenizer: nothing to download, every string encodable."""

from __future__ import annotations

import torch

from solo.errors import require

PAD, SOT, EOT = 0, 1, 2
BYTE_OFFSET = 3  # byte b is token b + 3
VOCAB_SIZE = 256 + BYTE_OFFSET


class ByteTokenizer:
    """UTF-8 bytes between a start and an end token, padded to `context_length`.

    A caption longer than the context keeps its first `context_length - 2` bytes; `encode` says so,
    so the data pipeline can count and report truncation instead of hiding it.
    """

    vocab_size = VOCAB_SIZE

    def __init__(self, context_length: int):
        if context_length < 3:
            raise ValueError(f"context_length must be >= 3 (start, one byte, end), got {context_length}")
        self.context_length = context_length

    def truncates(self, text: str) -> bool:
        """Whether `encode(text)` cuts the text: cheap, for counting at start without tokenising."""
        return len(text.encode("utf-8")) > self.context_length - 2

    def encode(self, text: str) -> tuple[torch.Tensor, bool]:
        data = text.encode("utf-8")
        room = self.context_length - 2
        ids = [SOT, *(b + BYTE_OFFSET for b in data[:room]), EOT]
        tokens = torch.full((self.context_length,), PAD, dtype=torch.long)
        tokens[: len(ids)] = torch.tensor(ids)
        return tokens, len(data) > room

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return torch.stack([self.encode(t)[0] for t in texts])

    @staticmethod
    def decode(tokens: torch.Tensor) -> str:
        data = bytes(int(t) - BYTE_OFFSET for t in tokens.tolist() if t >= BYTE_OFFSET)
        return data.decode("utf-8", errors="replace")


class OpenCLIPTokenizer:
    """open_clip's tokenizer for model `name` (`open_clip.get_tokenizer`: CLIP's BPE, vocabulary 49,408, for
    most models), with the interface of ByteTokenizer: `encode(text) -> (tokens, truncated)`, `truncates(text)`,
    `tokenizer(list of str) -> (n, context_length)` ids exactly as open_clip's."""

    def __init__(self, name: str, context_length: int):
        open_clip = require(
            "open_clip", "method.model (open_clip towers)", "open_clip"
        )  # solo's own towers need none of it

        self.tokenizer = open_clip.get_tokenizer(name, context_length=context_length)
        self.context_length = context_length
        self.vocab_size = getattr(self.tokenizer, "vocab_size", None)
        self._bpe = isinstance(self.tokenizer, open_clip.tokenizer.SimpleTokenizer)

    def truncates(self, text: str) -> bool:
        room = self.context_length - 2  # start and end tokens
        if self._bpe:  # CLIP's BPE never makes more tokens than UTF-8 bytes: most captions need no tokenising
            return len(text.encode("utf-8")) > room and len(self.tokenizer.encode(text)) > room
        # Others: does the text reach the last position of a context one longer (which padding fills for "")?
        longer = self.tokenizer([text, ""], context_length=self.context_length + 1)
        return bool(longer[0, -1] != longer[1, -1])

    def encode(self, text: str) -> tuple[torch.Tensor, bool]:
        return self([text])[0], self.truncates(text)

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(list(texts))
