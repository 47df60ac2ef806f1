"""Evaluate in eval mode, then leave every module as it was."""

from __future__ import annotations

from contextlib import contextmanager

import torch.nn as nn


@contextmanager
def eval_mode(*modules: nn.Module | None):
    """Run the body with `modules` (None entries ignored) in eval mode, then put each back in its mode."""
    modules = [m for m in modules if m is not None]
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)
