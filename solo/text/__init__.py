"""Text side of image-text methods: a byte-level tokenizer and a small Transformer text encoder."""

from solo.text.encoder import TextTransformer
from solo.text.tokenizer import EOT, PAD, SOT, VOCAB_SIZE, ByteTokenizer

__all__ = ["EOT", "PAD", "SOT", "VOCAB_SIZE", "ByteTokenizer", "TextTransformer"]
