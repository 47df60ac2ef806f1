#!/usr/bin/env python
"""Samples/s and peak memory of solo's whole SimCLR training step against the limit: a bare PyTorch loop doing the
same work.

    python bench/throughput.py                                            # ResNet-18 (3x3 stem), 32 px, batch 64, CPU
    python bench/throughput.py --backbone resnet50 --small-stem false --image-size 224 --device cuda --jpegs 512

The limit: one process, two views of random tensors already in memory, backbone forward + backward, a
projector (Linear-BN-ReLU-Linear), a single-process NT-Xent, an SGD step; nothing else. solo: its Trainer for
`method=simclr optim=sgd trainer.probe=false` (the model, its data loader, `TrainStep`) with the same backbone,
projector sizes, per-process batch and precision, stepping in a loop as `Trainer.fit` does, without the logging
and checkpoints; with `--nproc` > 1 through torchrun, so the global batch is nproc x batch. Its data: `data=synthetic`
(images generated and augmented by the DataLoader workers), or with `--jpegs N` N JPEG files of 400x300 px read with
`data.augment_on=device`: the workers only read the files' bytes, the device decodes them (nvJPEG on a GPU) and makes
the views, so the data path keeps up with a GPU (bench/data.py measures both paths). On CUDA both use
channels_last, as solo does there (`trainer.channels_last`). Peak memory: on CUDA the allocator's peak
(`torch.cuda.max_memory_allocated`, tensors only), on the CPU the process's peak resident memory (the interpreter and
libraries included), both over the timed steps. The last column compares like with like: on GPUs (one per process)
solo's samples/s per process over the limit's; on the CPU, where the processes share the machine's cores that the
limit's one process has to itself, solo's samples/s of all processes together over the limit's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # solo, from a checkout too

from data import make_images, stop_workers  # noqa: E402  (bench/data.py)
from hydra import compose, initialize_config_dir  # noqa: E402

from solo.backbones import create_backbone  # noqa: E402
from solo.config import check_required, register_configs, validate_pretrain  # noqa: E402
from solo.distributed.env import DistEnv, detect, process_group  # noqa: E402
from solo.train.trainer import Trainer  # noqa: E402


@dataclasses.dataclass
class Setup:
    """One measurement: the model, its input and how long to time it."""

    backbone: str
    small_stem: bool
    image_size: int
    batch: int  # per process
    precision: str  # "32" or "bf16"
    device: str
    steps: int  # timed, after `warmup`
    warmup: int
    backbone_kwargs: dict = dataclasses.field(default_factory=dict)
    proj_hidden: int = 2048
    proj_output: int = 128


@dataclasses.dataclass
class Measured:
    samples_per_s: float  # all processes together
    peak_bytes: int  # rank 0's
    build_s: float  # building the model (solo: the Trainer, trainer.compile's check that compiling works included)
    warmup_s: float  # the warm-up steps' time (compilation and the choice of kernels included)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak resident size starts again from the current


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    status = Path("/proc/self/status").read_text()
    return 1024 * int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def timed(step, s: Setup, device: torch.device, samples_per_step: int, build_s: float) -> Measured:
    """`step(index)` run `s.warmup` times, then `s.steps` times timed (the device's queue drained at both ends)."""
    start = time.perf_counter()
    for index in range(s.warmup):
        step(index)
    synchronize(device)
    reset_peak_memory(device)
    warmup_s, start = time.perf_counter() - start, time.perf_counter()
    for index in range(s.warmup, s.warmup + s.steps):
        step(index)
    synchronize(device)
    seconds = time.perf_counter() - start
    return Measured(samples_per_step * s.steps / seconds, peak_memory(device), build_s, warmup_s)


def bare(s: Setup) -> Measured:
    device = torch.device(s.device)
    start = time.perf_counter()
    backbone, width = create_backbone(s.backbone, small_stem=s.small_stem, **s.backbone_kwargs)
    projector = nn.Sequential(
        nn.Linear(width, s.proj_hidden),
        nn.BatchNorm1d(s.proj_hidden),
        nn.ReLU(),
        nn.Linear(s.proj_hidden, s.proj_output),
    )
    fmt = torch.channels_last if device.type == "cuda" else torch.preserve_format
    model = nn.Sequential(backbone, projector).to(device, memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    views = torch.randn(2 * s.batch, 3, s.image_size, s.image_size, device=device).to(memory_format=fmt)
    labels = torch.arange(2 * s.batch, device=device).roll(s.batch)  # view i's positive: the other view
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.precision == "bf16")
    build_s = time.perf_counter() - start

    def step(index: int) -> None:
        with autocast:
            z = F.normalize(model(views).float(), dim=1)
        logits = (z @ z.T / 0.2).fill_diagonal_(float("-inf"))
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return timed(step, s, device, s.batch, build_s)


def solo_overrides(s: Setup, jpegs: Path | None, probe: bool = False) -> list[str]:
    """main_pretrain.py's overrides for `s`: SimCLR with SGD, without the online probe (the bare model has none)
    unless `probe`; synthetic images, or the JPEG folder `jpegs` (bench/data.py's make_images) augmented on the
    device."""
    data = (
        ["data=imagefolder", f"data.root={jpegs}", "data.augment_on=device"]
        if jpegs
        else ["data=synthetic", f"data.num_samples={s.batch * 8}"]
    )
    return [
        "method=simclr",
        "optim=sgd",
        "backbone=resnet18",  # the group named, so no method's digits recipe picks its own backbone
        f"backbone.name={s.backbone}",
        f"backbone.small_stem={s.small_stem}",
        *(f"+backbone.kwargs.{k}={v}" for k, v in s.backbone_kwargs.items()),
        f"method.proj_hidden_dim={s.proj_hidden}",
        f"method.proj_output_dim={s.proj_output}",
        *data,
        f"data.image_size={s.image_size}",
        f"data.batch_size={s.batch}",
        f"trainer.precision={s.precision}",
        f"trainer.probe={probe}",
        "trainer.plots=false",
        "trainer.progress_bar=false",
    ]


def compose_pretrain(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        cfg = validate_pretrain(compose("pretrain", overrides=overrides))  # as main_pretrain.py does
    check_required(cfg)
    return cfg


def endless(source):
    """The train source's batches, epoch after epoch."""
    while True:
        yield from source
        source.set_epoch(source.epoch + 1)


def solo_trainer(overrides: list[str], run_dir: Path, env: DistEnv, device: torch.device) -> Trainer:
    return Trainer(compose_pretrain(overrides), run_dir, env, device)


def solo(s: Setup, env: DistEnv, jpegs: Path | None = None, more: list[str] = ()) -> Measured:
    """solo's step in this process (one of env.world_size), as Trainer.fit steps: a batch from its loader, moved to
    the device (the views made there with data.augment_on=device), TrainStep."""
    device = torch.device(s.device)
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        trainer = solo_trainer(solo_overrides(s, jpegs) + list(more), Path(run_dir), env, device)
        build_s = time.perf_counter() - start
        batches = endless(trainer.source)
        try:
            return timed(
                lambda index: trainer.train_step(trainer._to_device(next(batches)), index),
                s,
                device,
                s.batch * env.world_size,
                build_s,
            )
        finally:
            batches.close()
            stop_workers(trainer.source)


def solo_worker(job: str, more: list[str]) -> None:
    """One rank of a torchrun launch of this file (`job`: the Setup and the JPEG folder, as JSON): solo's rate,
    printed by rank 0."""
    job = json.loads(job)
    with process_group() as (env, device):
        s = Setup(**{**job["setup"], "device": str(device)})
        measured = solo(s, env, job["jpegs"] and Path(job["jpegs"]), more)
        if env.is_main:
            print(json.dumps(dataclasses.asdict(measured)))


def solo_launched(s: Setup, nproc: int, jpegs: Path | None, more: list[str]) -> Measured:
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
    job = json.dumps({"setup": dataclasses.asdict(s), "jpegs": jpegs and str(jpegs)})
    out = subprocess.run(
        [*launcher, __file__, "--solo-worker", job, *more], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    return Measured(**json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--small-stem", type=lambda s: s.lower() == "true", default=True)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--proj-hidden", type=int, default=2048)
    parser.add_argument("--proj-output", type=int, default=128)
    parser.add_argument("--precision", choices=["32", "bf16"], default="32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="solo's process counts")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--jpegs", type=int, default=0, help="solo reads this many JPEGs (0: data=synthetic)")
    parser.add_argument("--solo-worker", help=argparse.SUPPRESS)  # a torchrun rank's job, as JSON
    parser.add_argument("solo_overrides", nargs="*", help="more main_pretrain.py overrides, e.g. data.num_workers=0")
    args = parser.parse_args()
    if args.solo_worker:
        return solo_worker(args.solo_worker, args.solo_overrides)
    s = Setup(
        args.backbone,
        args.small_stem,
        args.image_size,
        args.batch,
        args.precision,
        args.device,
        args.steps,
        args.warmup,
        proj_hidden=args.proj_hidden,
        proj_output=args.proj_output,
    )
    jpegs = None
    if args.jpegs:
        jpegs = REPO / ".bench" / f"jpegs-{args.jpegs}"
        make_images(jpegs, args.jpegs, 300)
    print(
        f"{args.backbone} (small stem {args.small_stem}), {args.image_size} px, batch {args.batch} per process, "
        f"precision {args.precision}, {args.device}, {os.cpu_count()} CPUs ({torch.get_num_threads()} torch threads "
        f"in the bare loop); solo's data: {f'{args.jpegs} JPEGs, views on the device' if jpegs else 'synthetic'}"
    )
    limit = bare(s)
    per_device = args.device.startswith("cuda")
    memory = "peak allocated" if per_device else "peak RSS"
    print(
        f"| run | processes | samples/s | per process | {'per process' if per_device else 'all processes'} / limit "
        f"| {memory}, GiB |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| bare PyTorch loop (the limit) | 1 | {limit.samples_per_s:,.1f} | {limit.samples_per_s:,.1f} | 1.00 "
        f"| {limit.peak_bytes / 2**30:.2f} |",
        flush=True,
    )
    for nproc in args.nproc:
        if nproc == 1:
            got = solo(s, detect(), jpegs, args.solo_overrides)
        else:
            got = solo_launched(s, nproc, jpegs, args.solo_overrides)
        rate = got.samples_per_s
        ratio = rate / nproc / limit.samples_per_s if per_device else rate / limit.samples_per_s
        print(
            f"| solo, method=simclr | {nproc} | {rate:,.1f} | {rate / nproc:,.1f} | {ratio:.2f} "
            f"| {got.peak_bytes / 2**30:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
