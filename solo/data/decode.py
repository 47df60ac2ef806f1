"""Reading and decoding images, below every source and view: an unreadable file is one ImageReadError naming it,
and `data.on_bad_image=skip` replaces it by the next readable sample, the same on every rank, worker and world size."""

import io
from typing import Callable

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


def as_uint8_tensor(image) -> torch.Tensor:
    """A PIL image or uint8 tensor as a uint8 (3, H, W) RGB tensor."""
    return image if isinstance(image, torch.Tensor) else TF.pil_to_tensor(image.convert("RGB"))


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
            return raw_pixels(img.convert("RGB"))
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


def check_images(read: Callable, count: int, skip: bool) -> list[str]:
    """Decode the first `count` samples; unreadable ones are an error naming them, or with `skip` returned."""
    bad = []
    for i in range(count):
        try:
            read(i)
        except ImageReadError as e:
            bad.append(str(e))
    if bad and not skip:
        raise DataError(
            f"{len(bad)} of the first {count} images cannot be read: {'; '.join(bad[:3])}"
            f"{'; ...' if len(bad) > 3 else ''}. Fix or remove them, or set data.on_bad_image=skip"
        )
    return bad
