"""Input validation shared by the losses: fail with the name and value of what is wrong.

Checks of values (finite features, a positive tensor temperature, a covariance that whitening can factor) read
the tensor on the host: on a GPU each is a synchronisation that stalls the queue of kernels. The training step runs
the losses inside `host_reads_deferred()`, where those checks are skipped (so are the text tower's checks of its
token ids: solo.text.encoder); it watches the loss itself for non-finite values asynchronously instead
(solo.train.step). Shape and dtype checks need no read and always run.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from solo.text.encoder import token_checks_deferred

# False inside host_reads_deferred: scoped to the block (and thread), not the process.
_value_checks: ContextVar[bool] = ContextVar("solo_loss_value_checks", default=True)


@contextmanager
def host_reads_deferred():
    """Skip the losses' checks of tensor values, and the text tower's (see above), inside the block."""
    token = _value_checks.set(False)
    try:
        with token_checks_deferred():
            yield
    finally:
        _value_checks.reset(token)


def checks_values() -> bool:
    """Whether value checks that read tensors on the host run now (not inside host_reads_deferred)."""
    return _value_checks.get()


class NonFiniteError(ValueError):
    """Features with NaN or inf: training has diverged (or an input is broken)."""


def check_pair(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    for name, x in ((name_a, a), (name_b, b)):
        if x.dim() != 2:
            raise ValueError(f"{name} must be a 2-D (batch, features) tensor, got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"{name_a} and {name_b} must hold the same samples: batch sizes {a.shape[0]} and {b.shape[0]} differ"
        )
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{name_a} and {name_b} have different feature sizes: {a.shape[1]} and {b.shape[1]}")
    for name, x in ((name_a, a), (name_b, b)) if checks_values() else ():
        if not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).any(dim=1).sum())
            raise NonFiniteError(f"{name} has non-finite values (NaN or inf) in {bad} of {x.shape[0]} rows")


def check_positive(value: float | torch.Tensor, name: str) -> None:
    if isinstance(value, torch.Tensor) and not checks_values():
        return
    v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {v}")


def check_non_negative(value: float, name: str) -> None:
    if not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
