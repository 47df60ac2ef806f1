"""Reading and decoding images, below every source and view: an unreadable file is one ImageReadError naming it,
and `data.on_bad_image=skip` replaces it by the next readable sample, the same on every rank, worker and world size.
Every reader makes RGB of what it decodes in one way, `as_rgb`."""

import io
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from solo.errors import DataError, SoloError


class ImageReadError(SoloError, RuntimeError):
    """An image file exists but cannot be decoded."""


def read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ImageReadError(f"cannot read image {path}: {type(e).__name__}: {e}") from e


# What transparent pixels are composited on: white, as a page shows a transparent picture.
BACKGROUND = (255, 255, 255)
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # integer images, read as 0..65535


def as_rgb(image: Image.Image) -> Image.Image:
    """`image` decoded in full as 8-bit RGB, the same way in every reader (training, evaluation, the zoo's
    transform): transparency (RGBA, LA, a palette's or a transparent colour) composited on white; 16-bit (and
    32-bit integer) images scaled from 0..65535 to 0..255; grey, palette, 1-bit, CMYK and YCbCr by PIL's conversion.
    A truncated file fails here, as the whole image is decoded."""
    image.load()
    if image.mode == "RGB":
        return image
    if image.mode in SIXTEEN_BIT:
        grey = np.asarray(image).astype(np.float64) * (255 / 65535)
        image = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), mode="L")
    if image.mode == "P" or "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        background = Image.new("RGBA", image.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def decode(source: str | bytes, name: str) -> Image.Image:
    """The image file at path `source`, or of bytes `source`, decoded as RGB (`as_rgb`); a file that does not decode
    is an ImageReadError that calls it `name`."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            return as_rgb(img)
    except Exception as e:
        raise ImageReadError(f"cannot read {name}: {type(e).__name__}: {e}") from e


def as_uint8_tensor(image) -> torch.Tensor:
    """A PIL image or uint8 tensor as a uint8 (3, H, W) RGB tensor."""
    return image if isinstance(image, torch.Tensor) else TF.pil_to_tensor(as_rgb(image))


def raw_pixels(image) -> tuple[torch.Tensor, int, int]:
    """A decoded image as uint8 (3, H, W), H, W."""
    pixels = as_uint8_tensor(image)
    return pixels, pixels.shape[-2], pixels.shape[-1]


def raw_image(data: bytes, name: str) -> tuple[torch.Tensor, int, int]:
    """An image file's bytes for the device path, with its height and width. A JPEG (RGB or grey) that parses and
    ends with its end-of-image marker stays encoded, as a 1-D uint8 tensor, for the device to decode (nvJPEG on
    a GPU); anything else is decoded here, so a truncated or broken file is unreadable here exactly as on the CPU
    path (and skipped the same way with data.on_bad_image=skip)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if img.format == "JPEG" and img.mode in ("RGB", "L") and data.rstrip(b"\0").endswith(b"\xff\xd9"):
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), height, width
            return raw_pixels(as_rgb(img))
    except Exception as e:
        raise ImageReadError(f"cannot read {name}: {type(e).__name__}: {e}") from e


def read_or_skip(read: Callable, index: int, length: int, skip: bool):
    """(read(i), i) for i = index; with `skip`, an unreadable image gives way to the next readable sample
    (index + 1, ...), which depends on the files alone: the same on every rank, worker and world size."""
    for offset in range(length if skip else 1):
        i = (index + offset) % length
        try:
            return read(i), i
        except ImageReadError:
            if not skip:
                raise
    raise DataError(f"no image of the {length} samples can be read")


def unreadable(read: Callable, indices: Iterable[int], threads: int = 1) -> list[tuple[int, str]]:
    """(index, error message) of each sample among `indices` that `read` cannot decode, in the order given; decoded
    by `threads` threads (PIL and torchvision decode outside the GIL)."""

    def why(index: int):
        try:
            read(index)
        except ImageReadError as e:
            return index, str(e)
        return None

    with ThreadPoolExecutor(max(1, threads)) as pool:
        return [found for found in pool.map(why, indices) if found is not None]


class SkippedImages:
    """The unreadable images that data.on_bad_image=skip leaves out, each named once by `say` (the console and the
    log), with the count so far."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.named: set[str] = set()

    def name(self, messages: Iterable[str]) -> None:
        for message in messages:
            if message not in self.named:
                self.named.add(message)
                self.say(f"skipped an unreadable image ({len(self.named)} so far; data.on_bad_image=skip): {message}")

    def find(self, read: Callable, indices: Iterable[int]) -> None:
        """Name the samples among `indices` that `read` cannot decode."""
        self.name(message for _, message in unreadable(read, sorted(set(indices))))
