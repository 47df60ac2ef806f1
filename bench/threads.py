#!/usr/bin/env python
"""torch's intra-op threads for `python main_pretrain.py` (one process) on the default job (SimCLR, ResNet-18 with
the small stem, the digits at 16 px, batch 64, LARS): torch's own default (as many threads as it finds cores, what
solo ran with before it chose), `OMP_NUM_THREADS=1`, and solo's choice (trainer.threads unset: the process's cores
less its data workers).

    python bench/threads.py [--steps 33] [--repeats 2] [main_pretrain.py overrides ...]
    python bench/threads.py --steps 15 data=synthetic data.image_size=16 data.num_samples=1024 data.num_workers=1

The digits read in the main process (data.num_workers=0); the second command adds a data-loading worker beside the
model's threads, which solo leaves at all of the process's cores on the CPU.

Each configuration runs `--repeats` times, interleaved; images/s is the trainer's own figure for the steps after the
first logging window (start-up, the first steps and the epoch-end evaluation left out), the best of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def torch_default_threads() -> int:
    """What torch picks in a fresh process where nothing set OMP_NUM_THREADS."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env, capture_output=True, text=True
    )
    return int(out.stdout)


def images_per_second(overrides: list[str], env: dict, steps: int, run_dir: Path) -> float:
    window = steps // 3
    cmd = [
        sys.executable,
        "main_pretrain.py",
        *overrides,
        f"trainer.max_steps={steps}",
        f"trainer.log_every_steps={window}",
        "trainer.progress_bar=false",
        "trainer.plots=false",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r["train/img_per_s"] for r in rows if "train/img_per_s" in r]
    return max(windows[1:])  # the first window holds the first (slowest) steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=33)
    parser.add_argument("--repeats", type=int, default=2)
    args, overrides = parser.parse_known_args()
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    default = torch_default_threads()
    configurations = {
        f"torch's default ({default} threads)": ([f"trainer.threads={default}"], base),
        "OMP_NUM_THREADS=1": ([], {**base, "OMP_NUM_THREADS": "1"}),
        "solo's choice (trainer.threads unset)": ([], base),
    }
    best = dict.fromkeys(configurations, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for i, (name, (extra, env)) in enumerate(configurations.items()):
                run_dir = Path(tmp) / f"{repeat}-{i}"
                best[name] = max(best[name], images_per_second([*overrides, *extra], env, args.steps, run_dir))
    print(f"{os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable; {args.steps} steps, best of {args.repeats}")
    reference = max(best[k] for k in list(configurations)[:2])
    for name, speed in best.items():
        print(f"{name:40s} {speed:7.1f} img/s  ({speed / reference:.2f} of the better of the first two)")


if __name__ == "__main__":
    main()
