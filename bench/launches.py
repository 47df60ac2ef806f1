#!/usr/bin/env python
"""Aten operations a training step dispatches, solo's whole loop against the bare model's, on the CPU.

    python bench/launches.py                                  # ResNet-50 and ViT-S/16 (drop path 0.1), batch 8 and 64
    python bench/launches.py --models resnet50 --batches 8 --by-part
    python bench/launches.py --models resnet50 --methods byol dino swav   # each method's loop, against SimCLR's

On a GPU the host's launches bound a step whose kernels are short (docs/performance.md, the GPU rows). Counting them
needs no GPU: torch's profiler records every aten operation the step dispatches on the CPU, in one steady-state step
(after `--warmup` steps, not a logging step). Three counts:

- leaf operations: those that call no other aten operation (the count the goals below are set in). Most of a CPU
  step's are allocations (`aten::empty`: a native BatchNorm's forward is 8 of them, and not one of its own) and views;
- kernels: the operations that compute, the innermost ones that are neither an allocation, nor a view, nor a
  conversion that changes nothing (a native BatchNorm: one): the closest count to a GPU's launches;
- top-level operations: those called from Python, what the host's interpreter pays for.

- solo: its Trainer for `method=simclr optim=sgd data=imagefolder data.augment_on=device data.num_workers=0` with the
  online probe on, stepped as `Trainer.fit` steps: the next batch from its source (the files read in this process,
  the views made on the device, here the CPU), `TrainStep`, the metrics window. The files: `--images` JPEGs of 96 x 72
  px in 4 class folders, generated once under .bench/.
- bare: the bare loop of bench/throughput.py, the same step by hand: two views of random tensors already in memory,
  the backbone, a projector, NT-Xent, torch's fused SGD, the model once on both views, BatchNorm's statistics over
  both together (SimCLR's official code, and solo's SimCLR since 2026-12-05). No views are made, no probe trained.
  Also shown, "bare, views apart": each part that has BatchNorm (the projector, a ResNet) called once per view, each
  view its own statistics (solo-learn's and lightly's SimCLR, and the BYOL, Barlow Twins and VICReg references, which
  solo's methods of that kind take in one call, each view a group of rows: solo.distributed.batchnorm): another
  step, with more operations.

Both at 64 px, at each of `--batches` (samples per step, two views each). The goals (issue 58): solo / bare at most
1.25 at every batch, and solo's count at the largest batch at most 1.10 times its count at the smallest, so that no
per-sample loop is left. `--by-part` splits solo's leaf operations into reading and making the views, the step, and
the loop's metrics.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from data import make_images  # noqa: E402  (bench/data.py)
from throughput import Setup, bare_step, solo_trainer  # noqa: E402  (bench/throughput.py)

from solo.distributed.env import detect  # noqa: E402
from solo.errors import SoloError  # noqa: E402
from solo.methods import METHODS  # noqa: E402
from solo.train.trainer import MetricsWindow  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Model:
    backbone: str
    kwargs: dict  # timm's keyword arguments (the bare loop's; solo's as +backbone.kwargs.*)
    overrides: tuple[str, ...] = ()  # more of main_pretrain.py's


MODELS = {
    "resnet50": Model("resnet50", {}, ("backbone.small_stem=false",)),
    "vit_small": Model(
        "vit_small_patch16_224",
        {"img_size": 64, "drop_path_rate": 0.1},
        ("backbone.drop_path_rate=0.1", "optim.lr=0.01"),
    ),
}
PARTS = ("views", "step", "metrics")
# Operations that compute nothing on a device: allocations, views and metadata, and conversions that return their
# input (a childless aten::to or aten::contiguous).
NO_KERNEL = {
    f"aten::{name}"
    for name in (
        "empty empty_strided empty_like new_empty resize_ set_ view view_as _unsafe_view _reshape_alias reshape "
        "as_strided as_strided_ alias detach detach_ slice select unbind split split_with_sizes chunk narrow expand "
        "expand_as t transpose permute unsqueeze squeeze flatten unflatten numpy_T lift_fresh resolve_conj "
        "resolve_neg result_type to contiguous"
    ).split()
}
# The CUDA runtime's calls that launch work: kernels one by one, or a captured graph of them.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


@dataclasses.dataclass
class Count:
    leaves: int
    kernels: int
    top: int
    parts: collections.Counter  # leaf operations by part
    launches: int = 0  # on a GPU: the host's launch calls (a CUDA graph's replay: one)
    device_kernels: int = 0  # on a GPU: the kernels that ran


def counted(run, cuda: bool = False) -> Count:
    """The operations of `run()` (see the module's docstring); a part is the record_function range named in PARTS
    that holds an operation. With `cuda`, also the host's launch calls and the kernels that ran on the GPU."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    count = Count(0, 0, 0, collections.Counter())

    def computes(event) -> bool:  # whether `event` or an operation inside it computes; counts the innermost that do
        inside = [computes(child) for child in event.cpu_children if child.name.startswith("aten::")]
        if any(inside):
            return True
        if event.name in NO_KERNEL:
            return False
        count.kernels += 1
        return True

    for event in prof.events():
        if cuda and event.device_type == torch.autograd.DeviceType.CUDA:
            count.device_kernels += 1
            continue
        if event.name in LAUNCH_CALLS:
            count.launches += 1
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        if parent is None or not parent.name.startswith("aten::"):
            count.top += 1
            computes(event)
        if any(child.name.startswith("aten::") for child in event.cpu_children):
            continue
        count.leaves += 1
        while parent is not None and parent.name not in PARTS:
            parent = parent.cpu_parent
        count.parts[parent.name if parent is not None else "other"] += 1
    return count


def image_folder(count: int, size: int = 72, root: Path | None = None) -> Path:
    """`count` JPEGs of size x 4/3 size px in 4 class folders (labels, so that the probe trains), written once."""
    root = root or REPO / ".bench" / f"launches-{count}-{size}"
    if not (root / "train" / "c3").exists():
        shutil.rmtree(root, ignore_errors=True)
        paths = make_images(root, count, size)
        for c in range(4):
            (root / "train" / f"c{c}").mkdir()
        for i, path in enumerate(paths):
            path.rename(root / "train" / f"c{i % 4}" / path.name)
        (root / "train" / "all").rmdir()
    return root


def bare_count(
    model: Model,
    batch: int,
    warmup: int,
    views_apart: bool,
    image_size: int = 64,
    precision: str = "32",
    device: str = "cpu",
) -> Count:
    setup = Setup(model.backbone, False, image_size, batch, precision, device, 1, warmup, backbone_kwargs=model.kwargs)
    step, _ = bare_step(setup, views_apart=views_apart)
    for index in range(warmup):
        step(index)
    return counted(lambda: step(warmup), cuda=device.startswith("cuda"))


def solo_count(
    model: Model,
    batch: int,
    warmup: int,
    images: Path,
    image_size: int = 64,
    precision: str = "32",
    device: str = "cpu",
    more: tuple[str, ...] = (),
    method: str = "simclr",
) -> Count:
    """Trainer._fit's loop body on a step that does not log (the probe on, the views made on the device)."""
    overrides = [
        f"method={method}",
        "backbone=resnet18",  # the plain group, named: no method's digits backbone (resnet18_half, vit_tiny_6)
        "optim=sgd",
        f"backbone.name={model.backbone}",
        *(f"+backbone.kwargs.{k}={v}" for k, v in model.kwargs.items() if k != "drop_path_rate"),
        *model.overrides,
        "data=imagefolder",
        f"data.root={images}",
        "data.augment_on=device",
        "data.num_workers=0",
        f"data.image_size={image_size}",
        f"data.batch_size={batch}",
        f"trainer.precision={precision}",
        "trainer.probe=true",
        "trainer.knn_k=0",
        "trainer.memory_check=false",
        "trainer.plots=false",
        "trainer.progress_bar=false",
        "trainer.log_every_steps=1000",
        *more,
    ]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = solo_trainer(overrides, Path(run_dir), detect(), torch.device(device))
        batches = iter(trainer.source)
        window = MetricsWindow(trainer.device)

        def step(index: int) -> None:
            with record_function("views"):
                batch = next(batches)
            with record_function("step"):
                out = trainer.train_step(batch, index)
            with record_function("metrics"):
                window.add(out, batch)

        for index in range(warmup):
            step(index)
        result = counted(lambda: step(warmup), cuda=device.startswith("cuda"))
        with contextlib.suppress(StopIteration):
            batches.close()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--by-part", action="store_true", help="solo's leaf operations by part of the loop")
    parser.add_argument(
        "--methods",
        nargs="+",
        help="count solo's loop for these methods instead (their own heads, losses and views; no bare loop): its "
        "count at each batch, against SimCLR's, and how it grows with the batch",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    images = image_folder(max(256, 2 * max(args.batches) * (args.warmup + 2)))
    print(f"aten operations per steady-state step on the CPU, 64 px, torch {torch.__version__}")
    if args.methods:
        return methods_table(args, images)
    print("| model | batch | loop | leaf ops | kernels | top-level ops | solo / this loop: leaf ops | kernels |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        solo_leaves = {}
        for batch in args.batches:
            job = MODELS[model]
            loops = {
                "bare": bare_count(job, batch, args.warmup, views_apart=False),
                "bare, views apart": bare_count(job, batch, args.warmup, views_apart=True),
            }
            loops["solo"] = solo = solo_count(job, batch, args.warmup, images)
            solo_leaves[batch] = solo.leaves
            for name, c in loops.items():
                ratios = "| |" if name == "solo" else f"{solo.leaves / c.leaves:.2f} | {solo.kernels / c.kernels:.2f} |"
                print(f"| {model} | {batch} | {name} | {c.leaves:,} | {c.kernels:,} | {c.top:,} | {ratios}", flush=True)
            if args.by_part:
                parts = ", ".join(f"{p} {solo.parts[p]:,}" for p in (*PARTS, "other"))
                print(f"| {model} | {batch} | solo's leaf ops by part: {parts} | | | | | |")
        low, high = min(args.batches), max(args.batches)
        if high > low:
            growth = solo_leaves[high] / solo_leaves[low]
            print(f"| {model} | {high} / {low} | solo | {growth:.2f} | | | | |", flush=True)


def is_vit_job(model: Model) -> bool:
    return model.backbone.startswith("vit")


def methods_table(args, images: Path) -> None:
    """solo's leaf operations (and kernels) for each of `args.methods` on each model and batch: against SimCLR's at
    the same batch, and the largest batch's count against the smallest's (1.00: nothing per sample)."""
    low, high = min(args.batches), max(args.batches)
    print(
        f"| model | method | leaf ops, batch {low} | batch {high} | {high} / {low} | kernels, batch {high} | / SimCLR's |"
    )
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        job = MODELS[model]
        simclr = solo_count(job, high, args.warmup, images).leaves
        for method in args.methods:
            # Multi-crop's smaller crops through a ViT: timm resizes its position embeddings to each
            more = (
                ("+backbone.kwargs.dynamic_img_size=true",)
                if is_vit_job(job) and METHODS[method].target.local_crops
                else ()
            )
            try:
                counts = {b: solo_count(job, b, args.warmup, images, more=more, method=method) for b in (low, high)}
            except SoloError as error:  # a method this model or the image folder cannot feed (MAE on a ResNet, CLIP)
                print(f"| {model} | {method} | {error} | | | | |", flush=True)
                continue
            c_low, c_high = counts[low], counts[high]
            print(
                f"| {model} | {method} | {c_low.leaves:,} | {c_high.leaves:,} | {c_high.leaves / c_low.leaves:.2f} "
                f"| {c_high.kernels:,} | {c_high.leaves / simclr:.2f} |",
                flush=True,
            )
            if args.by_part:
                parts = " / ".join(", ".join(f"{p} {c.parts[p]:,}" for p in (*PARTS, "other")) for c in (c_low, c_high))
                print(f"| {model} | {method}: leaf ops by part, batch {low} / {high}: {parts} | | | | | |", flush=True)


if __name__ == "__main__":
    main()
