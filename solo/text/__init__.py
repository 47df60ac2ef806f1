"""Text side of image-text methods: a byte-level tokenizer and a small Transformer text encoder (solo's own text
tower), and open_clip's tokenizers behind the same interface (open_clip's text towers)."""

from solo.text.encoder import TextTransformer
from solo.text.tokenizer import EOT, PAD, SOT, VOCAB_SIZE, ByteTokenizer, OpenCLIPTokenizer

__all__ = ["EOT", "PAD", "SOT", "VOCAB_SIZE", "ByteTokenizer", "OpenCLIPTokenizer", "TextTransformer"]
