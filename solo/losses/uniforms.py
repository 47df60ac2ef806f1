"""What a loss draws once per step for the whole batch (DSE's k-means++ seeds, LeJEPA's and VISReg's directions) comes
from a function `uniforms(rows, columns)` of float64 uniforms in [0, 1), the same in every process: the trainer's hash
(run seed, step) on the device (solo.backbones.stochastic.step_uniforms: no generator made in the step, which stays one
graph when compiled); `seeded_uniforms` a fixed seed's; torch.rand where none is given."""

from __future__ import annotations

from typing import Callable

import torch

Uniforms = Callable[[int, int], torch.Tensor]


def seeded_uniforms(seed: int) -> Uniforms:
    """uniforms(rows, columns) from a torch generator seeded with `seed` (a fixed case, as the gradient checker's)."""
    generator = torch.Generator().manual_seed(seed)
    return lambda rows, columns: torch.rand(rows, columns, generator=generator, dtype=torch.float64)


def drawn(uniforms: Uniforms | None, rows: int, columns: int, device: torch.device | None) -> torch.Tensor:
    """(rows, columns) float64 uniforms on `device` from `uniforms`, or from torch's generator where it is None."""
    if uniforms is None:
        return torch.rand(rows, columns, dtype=torch.float64, device=device)
    return uniforms(rows, columns).to(device=device, dtype=torch.float64)
