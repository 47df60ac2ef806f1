"""Floating-point helpers shared by the losses, SyncBatchNorm and the trainer."""

import torch


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32; float32/float64 unchanged (tests run in float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
