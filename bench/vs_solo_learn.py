#!/usr/bin/env python
"""Training steps/s of solo and of solo-learn on the same JPEG files, with the same SimCLR configuration.

    python bench/vs_solo_learn.py                                    # clones solo-learn into .bench/ first
    python bench/vs_solo_learn.py --solo-learn /path/to/solo-learn   # or uses a checkout of it
    python bench/vs_solo_learn.py --nproc 1 2 --batch 32 --crop 64 --steps 10 40

solo-learn's package is also called `solo`, so it is installed in a virtual environment of its own (`--venv`, made
once, sharing this environment's torch and torchvision) and its main_pretrain.py runs from its checkout with that
environment's python; solo runs from this checkout.

Both train SimCLR on an ImageFolder of generated JPEGs (`--images` of `--image-size` px; class folders, no val
split, so neither validates): ResNet-18 (torchvision's, ImageNet stem), a 2048-2048-256 projector, temperature 0.2,
LARS (eta 0.02, biases and norms excluded), the per-process batch `--batch`, float32, the online linear probe that
both train beside the method, DataLoader workers `--workers` per process, two views of the same recipe: random
resized crop to `--crop` px (scale 0.08-1), flip 0.5, colour jitter 0.4/0.4/0.4/0.1 with p 0.8, grayscale 0.2,
blur 0.5; on 2 processes DDP. BatchNorm: torch's SyncBatchNorm, which Lightning's sync_batchnorm=True uses, refuses
CPU tensors, so on the CPU solo-learn runs with per-process BatchNorm, and solo once with its global BatchNorm (its
default, exact on any number of processes) and once with per-process BatchNorm (trainer.sync_batchnorm=false),
the same work as solo-learn's.
Each run is timed from outside; a step's time is (time of the long run - time of the short run) / (steps
difference), which leaves out start-up (imports, process group, model building, DataLoader workers) on both
sides. The command lines of both are printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOLO_LEARN_GIT = "https://github.com/vturrisi/solo-learn.git"

SOLO_LEARN_CONFIG = """\
defaults:
  - _self_
  - override hydra/hydra_logging: disabled
  - override hydra/job_logging: disabled
hydra:
  output_subdir: null
  run:
    dir: .
name: bench-simclr
method: simclr
backbone:
  name: resnet18
method_kwargs:
  proj_hidden_dim: 2048
  proj_output_dim: 256
  temperature: 0.2
data:
  dataset: custom
  train_path: {root}/train
  format: image_folder
  num_workers: {workers}
augmentations:
  - rrc:
      enabled: True
      crop_min_scale: 0.08
      crop_max_scale: 1.0
    color_jitter:
      prob: 0.8
      brightness: 0.4
      contrast: 0.4
      saturation: 0.4
      hue: 0.1
    grayscale:
      prob: 0.2
    gaussian_blur:
      prob: 0.5
    solarization:
      prob: 0.0
    equalization:
      prob: 0.0
    horizontal_flip:
      prob: 0.5
    crop_size: {crop}
    num_crops: 2
optimizer:
  name: lars
  batch_size: {batch}
  lr: 0.3
  classifier_lr: 0.1
  weight_decay: 1e-6
  kwargs:
    clip_lr: True
    eta: 0.02
    exclude_bias_n_norm: True
scheduler:
  name: warmup_cosine
checkpoint:
  enabled: False
auto_resume:
  enabled: False
wandb:
  enabled: False
max_epochs: 1000
max_steps: {steps}
devices: {devices}
sync_batchnorm: {sync}
accelerator: {accelerator}
strategy: {strategy}
precision: 32
enable_progress_bar: False
performance:
  disable_channel_last: True
"""


def make_images(root: Path, count: int, size: int) -> None:
    """An ImageFolder train split of `count` JPEGs (10 classes) from solo's synthetic data set, written once."""
    sys.path.insert(0, str(REPO))
    from solo.data import SyntheticDataset

    if (root / "done").exists():
        return
    images = SyntheticDataset(count, size, num_classes=10, seed=0)
    for i in range(count):
        image, label = images[i]
        folder = root / "train" / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:06d}.jpg", quality=90)
    (root / "done").touch()


def solo_learn_python(venv: Path, checkout: Path) -> Path:
    """The venv's python, with solo-learn's requirements installed (once). Its setup.py, and a namespace package
    among its requirements, import pkg_resources, which setuptools >= 81 no longer has: setuptools < 70 there."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "setuptools<70", "wheel"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", str(checkout)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "setuptools<70"], check=True
        )  # a requirement raised it
    return python


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout[-4000:]}")
    return time.perf_counter() - start


def solo_command(args, root: Path, nproc: int, steps: int, run_dir: str) -> list[str]:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
        if nproc > 1
        else [sys.executable]
    )
    return launcher + [
        "main_pretrain.py",
        "method=simclr",
        "augmentation=simclr",
        "optim=lars",
        "backbone=resnet18",
        "backbone.small_stem=false",
        "method.proj_hidden_dim=2048",
        "method.proj_output_dim=256",
        "method.temperature=0.2",
        "data=imagefolder",
        f"data.root={root}",
        f"data.image_size={args.crop}",
        f"data.batch_size={args.batch}",
        f"data.num_workers={args.workers}",
        f"data.augment_on={args.augment_on}",
        f"trainer.max_steps={steps}",
        "trainer.precision=32",
        "trainer.plots=false",
        "trainer.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]


def solo_learn_command(python: Path, checkout: Path, config_dir: Path) -> list[str]:
    # Run as a script from the checkout: its folder comes first on sys.path, so `solo` is solo-learn's.
    return [str(python), str(checkout / "main_pretrain.py"), "--config-path", str(config_dir), "--config-name", "bench"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--solo-learn",
        type=Path,
        default=REPO / ".bench" / "solo-learn",
        help=f"a checkout of solo-learn (cloned from {SOLO_LEARN_GIT} when missing)",
    )
    parser.add_argument("--venv", type=Path, default=REPO / ".bench" / "solo-learn-venv")
    parser.add_argument("--data", type=Path, default=REPO / ".bench" / "jpegs")
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--crop", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="per process")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per process, both frameworks")
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, nargs=2, default=[10, 40], help="the short and the long run")
    parser.add_argument("--augment-on", default="cpu", choices=["cpu", "device"], help="solo's data.augment_on")
    args = parser.parse_args()
    if args.images < args.batch * max(args.nproc) * max(args.steps):
        raise SystemExit("--images must cover the long run's steps without an epoch end (batch x processes x steps)")

    make_images(args.data, args.images, args.image_size)
    checkout = args.solo_learn.resolve()
    if not (checkout / "main_pretrain.py").exists():
        subprocess.run(["git", "clone", "--depth", "1", SOLO_LEARN_GIT, str(checkout)], check=True)
    python = solo_learn_python(args.venv, checkout)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    print(
        f"{args.images} JPEGs of {args.image_size} px, crops of {args.crop} px, batch {args.batch} per process, "
        f"{args.workers} DataLoader worker(s) per process, {args.device}, {os.cpu_count()} CPUs, "
        f"steps {args.steps[0]} and {args.steps[1]}, solo's data.augment_on={args.augment_on}"
    )
    print("| processes | BatchNorm | solo steps/s | solo-learn steps/s | solo / solo-learn |")
    print("|---|---|---|---|---|")
    for nproc in args.nproc:
        # torch's SyncBatchNorm (solo-learn's sync_batchnorm) runs on GPUs only.
        synced_peer = nproc > 1 and args.device == "cuda"
        rows = [("global", []), ("per process", ["trainer.sync_batchnorm=false"])] if nproc > 1 else [("-", [])]
        with tempfile.TemporaryDirectory() as tmp:
            config_dir = Path(tmp) / "config"
            config_dir.mkdir()
            peer = []
            for steps in args.steps:
                (config_dir / "bench.yaml").write_text(
                    SOLO_LEARN_CONFIG.format(
                        root=args.data,
                        workers=args.workers,
                        crop=args.crop,
                        batch=args.batch,
                        steps=steps,
                        devices=list(range(nproc)) if args.device == "cuda" else f'"{nproc}"',
                        sync=synced_peer,
                        accelerator="gpu" if args.device == "cuda" else "cpu",
                        strategy="ddp" if nproc > 1 else "auto",
                    )
                )
                work = Path(tmp) / f"solo-learn-{steps}"
                work.mkdir()
                peer.append(timed(solo_learn_command(python, checkout, config_dir), work, env))
            peer_rate = (args.steps[1] - args.steps[0]) / (peer[1] - peer[0])
            print(
                f"<!-- solo-learn: {' '.join(solo_learn_command(python, checkout, config_dir))} with bench.yaml:\n"
                f"{(config_dir / 'bench.yaml').read_text()} -->",
                file=sys.stderr,
            )
            for norm, extra in rows:
                seconds = []
                for steps in args.steps:
                    cmd = solo_command(args, args.data, nproc, steps, str(Path(tmp) / f"solo-{norm}-{steps}")) + extra
                    seconds.append(timed(cmd, REPO, env))
                print(f"<!-- solo: {' '.join(cmd)} -->", file=sys.stderr)
                rate = (args.steps[1] - args.steps[0]) / (seconds[1] - seconds[0])
                peer_norm = "global" if synced_peer else ("per process" if nproc > 1 else "-")
                print(
                    f"| {nproc} | solo {norm}, solo-learn {peer_norm} | {rate:.3f} | {peer_rate:.3f} | {rate / peer_rate:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
