#!/usr/bin/env python
"""solo's estimate of the training step's peak memory (trainer.memory_check, solo.train.estimates) against the peak
resident memory the process reached, on the CPU, for three configurations: the digits default, a ResNet-18 at 96 px
(the standard stem) and a ViT-S/16 at 224 px with 8 images per step.

    python bench/memory.py [--steps 2]

Each runs `python main_pretrain.py` for `--steps` steps with the data read in the main process (data.num_workers=0),
so that the process's peak RSS (getrusage of the child) is everything the run held.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGURATIONS = {
    "digits default (ResNet-18, small stem, 16 px, batch 64)": [],
    "ResNet-18 at 96 px (standard stem), batch 64": ["data=synthetic", "data.image_size=96"],
    "ViT-S/16 at 224 px, batch 8": [
        "data=synthetic",
        "data.image_size=224",
        "data.batch_size=8",
        "backbone.name=vit_small_patch16_224",
        "optim=adamw",
    ],
}


def peak_rss(overrides: list[str], steps: int, run_dir: Path) -> tuple[str, float]:
    """(the run's `memory:` line, the peak RSS of the process in GiB), from a fresh process."""
    code = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(p.stdout + p.stderr); print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = [
        sys.executable,
        "main_pretrain.py",
        *overrides,
        "data.num_workers=0",
        f"trainer.max_steps={steps}",
        "trainer.progress_bar=false",
        "trainer.plots=false",
        f"hydra.run.dir={run_dir}",
    ]
    out = subprocess.run(
        [sys.executable, "-c", code, *cmd], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("memory:"))
    return line, int(re.search(r"maxrss_kib (\d+)", out).group(1)) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.steps} steps each")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(CONFIGURATIONS.items()):
            line, peak = peak_rss(overrides, args.steps, Path(tmp) / str(i))
            estimate = float(re.search(r"about ([\d.]+) GiB", line).group(1))
            print(
                f"{name}: estimate {estimate:.1f} GiB, measured peak RSS {peak:.2f} GiB (estimate / peak {estimate / peak:.2f})"
            )
            print(f"    {line}")


if __name__ == "__main__":
    main()
