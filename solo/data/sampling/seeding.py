"""Per-sample seeding.

Augmentation randomness must depend only on (seed, epoch, sample index, view),
never on rank, worker count, world size or the order samples are read in. So
every view is computed inside its own freshly seeded RNG scope, and the scope
restores the process RNG afterwards: reading a sample never disturbs the
global RNG of whoever reads it.
"""

import contextlib
import random
from typing import Iterator

import numpy as np
import torch

_MASK_63 = (1 << 63) - 1


def sample_seed(seed: int, epoch: int, index: int, view: int) -> int:
    """A well-mixed 63-bit seed for one view of one sample in one epoch.

    SeedSequence hashes the whole tuple, so neighbouring tuples such as
    (0, 1, 2, 0) and (0, 1, 2, 1) give unrelated seeds (unlike ``seed + index``,
    where sample 1 of epoch 0 and sample 0 of epoch 1 could collide).
    """
    parts = {"seed": seed, "epoch": epoch, "index": index, "view": view}
    for name, value in parts.items():
        if int(value) < 0:
            raise ValueError(f"sample_seed needs non-negative integers, got {name}={value}")
    words = np.random.SeedSequence([int(v) for v in parts.values()]).generate_state(2, dtype=np.uint64)
    # Fold 128 bits into 63 so the result fits every consumer (torch.manual_seed, random.seed).
    return (int(words[0]) ^ (int(words[1]) << 1)) & _MASK_63


@contextlib.contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Run the body with the torch CPU RNG and Python's ``random`` seeded with ``seed``.

    Both states are restored on exit (also on error), so the caller's RNG
    streams are exactly as they were before.
    """
    py_state = random.getstate()
    # devices=[]: only the CPU generator; data transforms never touch CUDA RNGs.
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only: torch.manual_seed would also queue a lazy seeding of every accelerator's
        # generators, recording a stack trace each time (a cost per view: docs/performance.md).
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
