#!/usr/bin/env python
"""Samples/s of solo's whole SimCLR training step against the limit: a bare PyTorch loop doing the same work.

    python bench/throughput.py                                            # ResNet-18 (3x3 stem), 32 px, batch 64, CPU
    python bench/throughput.py --backbone resnet50 --image-size 224 --batch 128 --device cuda --nproc 1 8

The limit: one process, two views of random tensors already in memory, backbone forward + backward, a
projector (Linear-BN-ReLU-Linear), a single-process NT-Xent, an SGD step; nothing else. solo: `main_pretrain.py
method=simclr` on `data=synthetic` (images generated, decoded and augmented by the DataLoader workers, as any
data set is), the same backbone, projector sizes, per-process batch and precision, SGD, without the online probe;
with `--nproc` > 1 through torchrun, so the global batch is nproc x batch. Its samples/s are what the trainer
logs (`train/img_per_s`, over windows of `--log-every` steps; the median after the first window). The last column
compares like with like: on GPUs (one per process) solo's samples/s per process over the limit's; on the CPU,
where the processes share the machine's cores that the limit's one process has to itself, solo's samples/s of
all processes together over the limit's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # solo, from a checkout too

from solo.backbones import create_backbone  # noqa: E402


def bare_samples_per_second(args) -> float:
    device = torch.device(args.device)
    backbone, width = create_backbone(args.backbone, small_stem=args.small_stem)
    projector = nn.Sequential(
        nn.Linear(width, args.proj_hidden),
        nn.BatchNorm1d(args.proj_hidden),
        nn.ReLU(),
        nn.Linear(args.proj_hidden, args.proj_output),
    )
    model = nn.Sequential(backbone, projector).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    views = torch.randn(2 * args.batch, 3, args.image_size, args.image_size, device=device)
    labels = torch.arange(2 * args.batch, device=device).roll(args.batch)  # view i's positive: the other view
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step():
        with autocast:
            z = F.normalize(model(views).float(), dim=1)
        logits = (z @ z.T / 0.2).fill_diagonal_(float("-inf"))
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return args.batch * args.steps / (time.perf_counter() - start)


def solo_samples_per_second(args, nproc: int) -> float:
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as run_dir:
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
            if nproc > 1
            else [sys.executable]
        )
        cmd = (
            launcher
            + [
                "main_pretrain.py",
                "method=simclr",
                "optim=sgd",
                f"backbone.name={args.backbone}",
                f"backbone.small_stem={args.small_stem}",
                f"method.proj_hidden_dim={args.proj_hidden}",
                f"method.proj_output_dim={args.proj_output}",
                "data=synthetic",
                f"data.image_size={args.image_size}",
                f"data.batch_size={args.batch}",
                f"data.num_samples={args.batch * nproc * (steps + 1)}",
                f"trainer.max_steps={steps}",
                f"trainer.precision={args.precision}",
                "trainer.probe=false",
                f"trainer.log_every_steps={args.log_every}",
                "trainer.plots=false",
                "trainer.progress_bar=false",
                f"hydra.run.dir={run_dir}",
            ]
            + args.solo_overrides
        )
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rates = [m["train/img_per_s"] for m in map(json.loads, f) if "train/img_per_s" in m]
    return statistics.median(rates[1:] or rates)


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
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("solo_overrides", nargs="*", help="more main_pretrain.py overrides, e.g. data.num_workers=0")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(
        f"{args.backbone} (small stem {args.small_stem}), {args.image_size} px, batch {args.batch} per process, "
        f"precision {args.precision}, {args.device}, {os.cpu_count()} CPUs ({threads} torch threads in the bare loop)"
    )
    limit = bare_samples_per_second(args)
    per_device = args.device.startswith("cuda")
    print(f"| run | processes | samples/s | per process | {'per process' if per_device else 'all processes'} / limit |")
    print("|---|---|---|---|---|")
    print(f"| bare PyTorch loop (the limit) | 1 | {limit:,.1f} | {limit:,.1f} | 1.00 |", flush=True)
    for nproc in args.nproc:
        rate = solo_samples_per_second(args, nproc)
        ratio = rate / nproc / limit if per_device else rate / limit
        print(
            f"| solo `main_pretrain.py method=simclr` | {nproc} | {rate:,.1f} | {rate / nproc:,.1f} | {ratio:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
