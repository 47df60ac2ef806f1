#!/usr/bin/env python3
"""The GPU kit's driver: every GPU check and benchmark, one `## ` section each in one markdown report. bench/gpu.sh
prepares its environment and runs it:

    python3 bench/gpu.py REPORT --work DIR [--dry-run] [--gpus N] [--device-name NAME] [--budget SECONDS]

Each step runs in a process forked from this one (which imported torch and solo once, and never touches CUDA: a
process that has cannot fork), in a process group of its own, under its own time limit and what is left of the
kit's `--budget`; a step past its limit is killed with everything it started, and its section says so. The report
is rewritten after every step, every section not yet done marked as not finished, so whatever stops the kit, the
report says how far it got. Every step's output goes to REPORT.log. `STEP_TIMEOUT=SECONDS` sets every step's limit.

--dry-run: the same steps on the CPU at toy sizes (tiny backbones, 16 px, a few steps), where the GPU's own tools
have CPU stand-ins: solo's global BatchNorm against one BatchNorm (torch's SyncBatchNorm runs on GPUs only), the
process's peak resident memory for the allocator's peak, solo.train.host_reads.HostReads for
torch.cuda.set_sync_debug_mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


@dataclasses.dataclass(frozen=True)
class Model:
    label: str
    backbone: str
    small_stem: bool = False
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Sizes:
    bn: tuple[int, int, int]  # rows per rank, channels, height = width
    exact: Model  # a LayerNorm backbone: accumulation is exact for it (BatchNorm would see micro-batch statistics)
    exact_image: int
    exact_batch: int
    exact_steps: int
    models: tuple[Model, ...]  # the throughput step's
    image: int
    batch: int
    warmup: int
    steps: int
    projector: tuple[int, int]  # hidden, output
    jpegs: int  # JPEG files of jpeg_size x 4/3 px, solo's data in the throughput, compile and sync steps
    jpeg_size: int
    data_batch: int
    one_thread_images: int  # the augmentation step's one-thread rows read these many
    compiled: tuple[Model, ...]  # the compile step's: the first with every trainer.compile, the others off and step
    compiled_precision: str
    compiled_steps: int  # timed, after one warm-up step (the compilation)
    launched: tuple[Model, ...]  # the launch count's
    launched_precision: str
    launched_batch: int
    synced: Model
    synced_precision: str
    synced_batch: int


TINY_VIT = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2}
GPU = Sizes(
    bn=(16, 64, 8),
    exact=Model(
        "ViT (2 blocks of 192, 32 px)", "vit_tiny_patch16_224", kwargs={"img_size": 32, "patch_size": 4, "depth": 2}
    ),
    exact_image=32,
    exact_batch=32,
    exact_steps=3,
    models=(Model("ResNet-50", "resnet50"), Model("ViT-B/16", "vit_base_patch16_224")),
    image=224,
    batch=64,
    warmup=5,
    steps=20,
    projector=(2048, 128),
    jpegs=512,
    jpeg_size=300,
    data_batch=64,
    one_thread_images=128,
    compiled=(Model("ViT-B/16", "vit_base_patch16_224"), Model("ResNet-50", "resnet50")),
    compiled_precision="bf16",
    compiled_steps=15,
    launched=(Model("ResNet-50", "resnet50"), Model("ViT-B/16", "vit_base_patch16_224")),
    launched_precision="bf16",
    launched_batch=64,
    synced=Model("ResNet-50", "resnet50"),
    synced_precision="bf16",
    synced_batch=32,
)
DRY = Sizes(
    bn=(4, 3, 4),
    exact=Model("ViT (2 blocks of 32, 16 px)", "vit_tiny_patch16_224", kwargs=TINY_VIT),
    exact_image=16,
    exact_batch=16,
    exact_steps=3,
    models=(
        Model("ResNet (timm test_resnet)", "test_resnet", small_stem=True),
        Model("ViT (2 blocks of 32)", "vit_tiny_patch16_224", kwargs=TINY_VIT),
    ),
    image=16,
    batch=8,
    warmup=1,
    steps=2,
    projector=(32, 16),
    jpegs=16,
    jpeg_size=24,
    data_batch=4,
    one_thread_images=8,
    compiled=(Model("ViT (2 blocks of 32)", "vit_tiny_patch16_224", kwargs=TINY_VIT),),
    compiled_precision="32",
    compiled_steps=2,
    launched=(
        Model("ResNet (timm test_resnet)", "test_resnet", small_stem=True),
        Model("ViT (2 blocks of 32)", "vit_tiny_patch16_224", kwargs=TINY_VIT),
    ),
    launched_precision="32",
    launched_batch=4,
    synced=Model("ResNet (timm test_resnet)", "test_resnet", small_stem=True),
    synced_precision="32",
    synced_batch=8,
)


@dataclasses.dataclass(frozen=True)
class Context:
    dry: bool
    gpus: int
    sizes: Sizes
    work: Path

    @property
    def device(self):
        import torch

        return torch.device("cpu") if self.dry else torch.device("cuda", 0)


# ---------------------------------------------------------------------------------------------------------- steps


def _bn_inputs(sizes: Sizes, world: int):
    import torch

    rows, channels, side = sizes.bn
    g = torch.Generator().manual_seed(0)
    x = torch.randn(world * rows, channels, side, side, dtype=torch.float64, generator=g) * 2 + 5  # a large mean
    upstream = torch.randn(x.shape, dtype=torch.float64, generator=g)  # the gradient arriving at the output
    weight = torch.linspace(0.5, 2.0, channels, dtype=torch.float64)
    bias = torch.linspace(-0.2, 0.3, channels, dtype=torch.float64)
    return x, upstream, weight, bias


BN_KINDS = {"solo": "solo's global BatchNorm", "torch": "torch's SyncBatchNorm"}
BN_DTYPES = ("float64", "float32")


def _bn_rank(rank: int, world: int, store: str, kinds: list[str], ctx: Context, out: str) -> None:
    """One of `world` gloo processes (both on the one GPU, or on the CPU): each BatchNorm of `kinds` on this rank's
    rows of the batch, forward and backward; the parameters' gradients summed over ranks, as DDP sums them."""
    import torch
    import torch.distributed as dist

    from solo.distributed.batchnorm import SyncBatchNorm

    torch.set_num_threads(1)
    device = ctx.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x, upstream, weight, bias = _bn_inputs(ctx.sizes, world)
    rows = ctx.sizes.bn[0]
    mine = slice(rank * rows, (rank + 1) * rows)
    results = {}
    for dtype_name in BN_DTYPES:
        dtype = getattr(torch, dtype_name)
        for kind in kinds:
            cls = torch.nn.SyncBatchNorm if kind == "torch" else SyncBatchNorm
            bn = cls(x.shape[1], device=device, dtype=dtype)
            with torch.no_grad():
                bn.weight.copy_(weight), bn.bias.copy_(bias)
            part = x[mine].to(device, dtype).requires_grad_()
            y = bn(part)
            (y * upstream[mine].to(device, dtype)).sum().backward()
            grads = [bn.weight.grad.clone(), bn.bias.grad.clone()]
            for g in grads:
                dist.all_reduce(g)
            results[(dtype_name, kind)] = {
                "output": y.detach(),
                "input gradient": part.grad,
                "weight gradient": grads[0],
                "bias gradient": grads[1],
                "running mean": bn.running_mean,
                "running variance": bn.running_var,
            }
    results = {k: {name: t.double().cpu() for name, t in v.items()} for k, v in results.items()}
    torch.save(results, out)
    dist.destroy_process_group()


def step_batchnorm(ctx: Context) -> list[str]:
    """torch's SyncBatchNorm (what solo uses on GPUs) and solo's own global BatchNorm, on 2 processes sharing the
    batch over gloo, each against one BatchNorm on the whole batch in float64 on the CPU, and against each other."""
    import torch

    world = 2
    kinds = ["solo", "torch"] if ctx.device.type == "cuda" else ["solo"]
    forked = multiprocessing.get_context("fork")
    store, outs = ctx.work / "bn-store", [ctx.work / f"bn-{r}.pt" for r in range(world)]
    store.unlink(missing_ok=True)
    ranks = [
        forked.Process(target=_bn_rank, args=(r, world, str(store), kinds, ctx, str(outs[r]))) for r in range(world)
    ]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    if any(p.exitcode != 0 for p in ranks):
        raise RuntimeError(f"a BatchNorm process failed (exit codes {[p.exitcode for p in ranks]}): see the log")
    per_rank = [torch.load(o) for o in outs]
    got = {k: {name: torch.cat([r[k][name] for r in per_rank]) for name in per_rank[0][k]} for k in per_rank[0]}
    got = {  # the parameters' gradients and the running statistics are whole on every rank: rank 0's
        k: {name: t if name in ("output", "input gradient") else per_rank[0][k][name] for name, t in v.items()}
        for k, v in got.items()
    }

    x, upstream, weight, bias = _bn_inputs(ctx.sizes, world)
    x.requires_grad_()
    one = torch.nn.BatchNorm2d(x.shape[1], dtype=torch.float64)
    with torch.no_grad():
        one.weight.copy_(weight), one.bias.copy_(bias)
    y = one(x)
    (y * upstream).sum().backward()
    reference = {
        "output": y.detach(),
        "input gradient": x.grad,
        "weight gradient": one.weight.grad,
        "bias gradient": one.bias.grad,
        "running mean": one.running_mean,
        "running variance": one.running_var,
    }

    def largest(a: dict, b: dict) -> str:
        return ", ".join(f"{name} {float((a[name] - b[name]).abs().max()):.1e}" for name in a)

    rows, channels, side = ctx.sizes.bn
    lines = [
        f"{world} processes of {rows} rows each (gloo, on {ctx.device}), {channels} channels of {side}x{side}; the "
        "largest absolute difference of each quantity (outputs and gradients of the input have the scale of 1):",
        "",
        "| precision | compared | output, gradients, running statistics |",
        "|---|---|---|",
    ]
    for dtype_name in BN_DTYPES:
        for kind in kinds:
            lines.append(
                f"| {dtype_name} | {BN_KINDS[kind]} against one BatchNorm (float64) "
                f"| {largest(got[(dtype_name, kind)], reference)} |"
            )
        if len(kinds) == 2:
            lines.append(
                f"| {dtype_name} | torch's SyncBatchNorm against solo's global BatchNorm "
                f"| {largest(got[(dtype_name, 'torch')], got[(dtype_name, 'solo')])} |"
            )
    if len(kinds) == 1:
        lines += ["", "torch's SyncBatchNorm runs on GPUs only: on the CPU solo's own is compared with the reference."]
    return lines


def step_accumulation(ctx: Context) -> list[str]:
    """One process in float64, trainer.accumulate=2 against 1 on the same batches: the same weights to rounding."""
    from throughput import endless, solo_trainer

    from solo.distributed.env import detect

    s, m = ctx.sizes, ctx.sizes.exact
    overrides = [
        "method=simclr",
        "backbone=resnet18",
        f"backbone.name={m.backbone}",
        "backbone.small_stem=false",
        *(f"+backbone.kwargs.{k}={v}" for k, v in m.kwargs.items()),
        "method.proj_hidden_dim=64",
        "method.proj_output_dim=32",
        "data=synthetic",
        f"data.image_size={s.exact_image}",
        f"data.num_samples={s.exact_batch * s.exact_steps}",
        f"data.batch_size={s.exact_batch}",
        "data.num_workers=0",
        "data.augment_on=device",
        "optim.warmup_epochs=0",
        "trainer.precision=64",
        "trainer.progress_bar=false",
        "trainer.plots=false",
    ]

    def floating(model) -> dict:
        return {n: t.detach().double().cpu().clone() for n, t in model.state_dict().items() if t.is_floating_point()}

    weights = {}
    for k in (1, 2):
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = solo_trainer(overrides + [f"trainer.accumulate={k}"], Path(run_dir), detect(), ctx.device)
            start = floating(trainer.model)
            batches = endless(trainer.source)  # on the device (the source moves them)
            for index in range(s.exact_steps):
                trainer.train_step(next(batches), index)
            weights[k] = floating(trainer.model)
    moved = max(float((weights[1][n] - start[n]).abs().max()) for n in start)
    worst, name = max((float((weights[1][n] - weights[2][n]).abs().max()), n) for n in start)
    return [
        f"SimCLR on a {m.label}, batch {s.exact_batch}, {s.exact_steps} steps, float64 on {ctx.device}; the weights "
        "(parameters and BatchNorm statistics) after the steps:",
        "",
        "| compared | largest weight difference | largest weight change over the steps | difference / change |",
        "|---|---|---|---|",
        f"| trainer.accumulate=2 against 1 | {worst:.1e} (`{name}`) | {moved:.1e} | {worst / moved:.1e} |",
        "",
        "The test suite holds the ratio under 1e-10 on the CPU (tests/test_accumulate.py).",
    ]


def _jpegs(ctx: Context) -> Path:
    """The JPEG folder of the steps that read files (written once, by whichever step needs it first)."""
    from data import make_images

    s = ctx.sizes
    folder = ctx.work / f"jpegs-{s.jpegs}-{s.jpeg_size}"
    if not folder.exists():
        partial = Path(tempfile.mkdtemp(dir=ctx.work))
        make_images(partial, s.jpegs, s.jpeg_size)
        partial.rename(folder)  # whole or absent: a step killed while writing leaves no half folder
    return folder


def _setup(ctx: Context, model: Model, precision: str, batch: int, steps: int, warmup: int):
    from throughput import Setup

    s = ctx.sizes
    return Setup(
        model.backbone,
        model.small_stem,
        s.image,
        batch,
        precision,
        str(ctx.device),
        steps,
        warmup,
        backbone_kwargs=dict(model.kwargs),
        proj_hidden=s.projector[0],
        proj_output=s.projector[1],
    )


def _release(device) -> None:
    """Free what the last measurement left: objects in reference cycles, and the device memory they held."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _memory_name(ctx: Context) -> str:
    return "peak allocated on the GPU" if ctx.device.type == "cuda" else "peak RSS of the process"


def step_throughput(ctx: Context) -> list[str]:
    from throughput import bare, solo

    from solo.distributed.env import detect

    s = ctx.sizes
    jpegs = _jpegs(ctx)
    lines = [
        f"SimCLR, {s.image} px, batch {s.batch} (2 views each), projector {s.projector[0]}-{s.projector[1]}, SGD; "
        f"steps: {s.warmup} to warm up, {s.steps} timed. The bare model: backbone, projector, NT-Xent and SGD on "
        "tensors already on the device. solo: its Trainer's loader and TrainStep (bench/throughput.py), reading "
        f"{s.jpegs} JPEGs of {s.jpeg_size * 4 // 3}x{s.jpeg_size} px with data.augment_on=device: the workers read the "
        "files' bytes, the device decodes them and makes the views, so the data path is not the bottleneck "
        f"(the augmentation step measures it). Memory: the {_memory_name(ctx)} over the timed steps.",
        "",
        "| model | precision | bare samples/s | solo samples/s | solo / bare | bare GiB | solo GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in s.models:
        for precision in ("bf16", "32"):
            setup = _setup(ctx, model, precision, s.batch, s.steps, s.warmup)
            limit = bare(setup)
            _release(ctx.device)
            print(f"{model.label}, {precision}: bare {limit}", flush=True)
            got = solo(setup, detect(), jpegs)
            _release(ctx.device)
            print(f"{model.label}, {precision}: solo {got}", flush=True)
            lines.append(
                f"| {model.label} | {precision} | {limit.samples_per_s:,.1f} | {got.samples_per_s:,.1f} "
                f"| {got.samples_per_s / limit.samples_per_s:.2f} | {limit.peak_bytes / 2**30:.2f} "
                f"| {got.peak_bytes / 2**30:.2f} |"
            )
    return lines


def step_augmentation(ctx: Context) -> list[str]:
    import torch
    from data import solo_cpu, solo_datasets, solo_device, solo_loader

    from solo.data.sampling.source import loader_workers

    s = ctx.sizes
    torch.set_num_threads(1)  # a DataLoader worker's
    cpu, raw = solo_datasets(_jpegs(ctx), s.image)
    workers = loader_workers(None)
    one_cpu = solo_cpu(cpu, s.data_batch, s.one_thread_images)
    one_worker, on_device = solo_device(raw, s.data_batch, ctx.device, s.one_thread_images)
    loader_cpu = solo_loader(cpu, s.data_batch, workers, ctx.device)
    loader_device = solo_loader(raw, s.data_batch, workers, ctx.device)
    apart = device_against_cpu(raw, s.data_batch, ctx.device)
    return [
        f"{s.jpegs} JPEGs of {s.jpeg_size * 4 // 3}x{s.jpeg_size} px -> 2 SimCLR views of {s.image} px, batches of "
        f"{s.data_batch} (bench/data.py); DataLoader workers: {workers} (solo's default here: the CPUs less one, at "
        f"most 8, of {os.cpu_count()}).",
        "",
        "| pipeline | views/s |",
        "|---|---|",
        f"| data.augment_on=cpu, one worker (one thread): read, decode, views | {one_cpu:,.0f} |",
        f"| data.augment_on=device, one worker's share (one thread): read, JPEG header, parameters | {one_worker:,.0f} |",
        f"| data.augment_on=device, the device's share on {ctx.device}: decode, views | {on_device:,.0f} |",
        f"| data.augment_on=cpu through solo's loader, all its workers | {loader_cpu:,.0f} |",
        f"| data.augment_on=device through solo's loader, all its workers, views on {ctx.device} "
        f"| {loader_device:,.0f} |",
        "",
        f"The same batch's views made on {ctx.device} and on the CPU (DeviceViews: the same operations, the devices' "
        "kernels), in [0, 1] pixel units:",
        "",
        "| compared | mean difference | largest difference |",
        "|---|---|---|",
        f"| {ctx.device} against the CPU | {apart[0]:.1e} | {apart[1]:.1e} |",
    ]


def device_against_cpu(raw, batch: int, device) -> tuple[float, float]:
    """(mean, largest) absolute difference between the views of one raw batch made on `device` and on the CPU."""
    import torch
    from data import batches

    from solo.data.views.augment import DeviceViews
    from solo.data.views.multiview import collate_raw

    sample = collate_raw(raw.__getitems__(batches(batch, batch)[0]))
    views = DeviceViews(raw.view_transforms, pairs=False)
    std = torch.tensor(raw.view_transforms[0].std).view(1, 3, 1, 1)
    here, there = (torch.cat(views(dict(sample), d)["views"]).cpu() * std for d in (device, torch.device("cpu")))
    difference = (here - there).abs()
    return float(difference.mean()), float(difference.max())


def step_launches(ctx: Context) -> list[str]:
    """What one steady-state step launches, solo's loop against the bare loop (bench/launches.py): on a GPU the host's
    launch calls and the kernels that ran (torch's profiler), and the aten operations beside them."""
    from launches import Model as Job
    from launches import bare_count, image_folder, solo_count

    s = ctx.sizes
    images = image_folder(2 * s.launched_batch * 4, s.jpeg_size, ctx.work / "launches")
    device, cuda = str(ctx.device), ctx.device.type == "cuda"
    lines = [
        f"One steady-state step (after 2 warm-up steps, not a logging step), batch {s.launched_batch} (2 views each), "
        f"{s.image} px, precision {s.launched_precision}, on {ctx.device}: the bare loop (the model on tensors already "
        "on the device, once on both views, as solo's SimCLR and its official code; bench/launches.py) and solo's "
        "loop (reading JPEGs, the views made on the device, the probe on). Launch calls: the CUDA runtime's kernel "
        "and graph launches from the host; kernels: those that ran on the GPU.",
        "",
        "| model | loop | launch calls | kernels run | aten leaf ops | solo / bare, launch calls |",
        "|---|---|---|---|---|---|",
    ]
    for model in s.launched:
        job = Job(model.backbone, dict(model.kwargs), (f"backbone.small_stem={str(model.small_stem).lower()}",))
        sizes = dict(image_size=s.image, precision=s.launched_precision, device=device)
        bare = bare_count(job, s.launched_batch, 2, views_apart=False, **sizes)
        _release(ctx.device)
        solo = solo_count(job, s.launched_batch, 2, images, **sizes)
        _release(ctx.device)
        for name, got in (("bare", bare), ("solo", solo)):
            ratio = f"{solo.launches / bare.launches:.2f}" if cuda and name == "solo" else "-"
            calls, kernels = (f"{got.launches:,}", f"{got.device_kernels:,}") if cuda else ("-", "-")
            lines.append(f"| {model.label} | {name} | {calls} | {kernels} | {got.leaves:,} | {ratio} |")
    if not cuda:
        lines += ["", "On the CPU no kernels are launched: the aten operations are the figure (bench/launches.py)."]
    return lines


def step_compile(ctx: Context) -> list[str]:
    import warnings
    from functools import partial

    from launches import counted
    from throughput import bare, solo_step, timed

    from solo.distributed.env import detect

    s = ctx.sizes
    cuda = ctx.device.type == "cuda"
    if not cuda:
        # The CPU's C++ kernels unvectorised and compiled in this process: half the compile time here (no worker
        # pool to start on 2 cores); the GPU's Triton kernels are compiled as a user's run compiles them.
        import torch._inductor.config as inductor

        inductor.cpp.simdlen = 1
        inductor.compile_threads = 1
    jpegs = _jpegs(ctx)
    lines = [
        f"solo's step (as in the throughput step) at {s.image} px, batch {s.batch}, precision {s.compiled_precision}, "
        f"on {ctx.device}: trainer.compile off, blocks (each block compiled) and step (the whole step: forward, "
        "backward, optimizer, EMA; CUDA graphs on a GPU), against the bare model's eager loop. Building the Trainer "
        "includes the check that compiling works; the first step compiles; then "
        f"{s.compiled_steps} steps timed, then as many of the step alone (on the last batch again: no data read, "
        "nothing compiled again), then one counted (the CUDA runtime's launch calls from the host).",
        "",
        "| model | trainer.compile | Trainer built, s | first step, s | samples/s | / bare eager "
        "| the step alone / bare eager | launch calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    eager_only = []
    for i, model in enumerate(s.compiled):
        setup = _setup(ctx, model, s.compiled_precision, s.batch, s.compiled_steps, warmup=1)
        limit = bare(setup).samples_per_s
        _release(ctx.device)
        scopes = ("off", "blocks", "step") if i == 0 else ("off", "step")
        for scope in scopes if cuda else scopes[:2]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with solo_step(setup, detect(), jpegs, [f"trainer.compile={scope}"]) as (step, build_s, _, _):
                    got = timed(step, setup, ctx.device, s.batch, build_s)
                    alone = timed(partial(step, again=True), setup, ctx.device, s.batch, build_s)
                    launches = counted(lambda: step(setup.warmup + setup.steps), cuda=cuda).launches  # noqa: B023
            calls = f"{launches:,}" if cuda else "-"
            _release(ctx.device)
            # Where compiling does not work, the trainer says why and runs eager: say so beside the row.
            eager_only += [str(w.message) for w in caught if "does not work here" in str(w.message)]
            lines.append(
                f"| {model.label} | {scope} | {got.build_s:.1f} | {got.warmup_s:.1f} | {got.samples_per_s:,.1f} "
                f"| {got.samples_per_s / limit:.2f} | {alone.samples_per_s / limit:.2f} | {calls} |"
            )
    if not cuda:
        lines += [
            "",
            "trainer.compile=step is not in the dry run: inductor takes one to two minutes a model on the CPU "
            "(tests/test_compiled_step.py compiles it).",
        ]
    return lines + (["", f"Not compiled: {eager_only[0]}"] if eager_only else [])


def step_syncs(ctx: Context) -> list[str]:
    """Host reads (and on a GPU, synchronisations) in one steady-state step that does not log, by part."""
    import warnings

    import torch
    from throughput import endless_loader, solo_overrides, solo_trainer

    from solo.distributed.env import detect
    from solo.train.host_reads import HostReads
    from solo.train.trainer import MetricsWindow

    s, m = ctx.sizes, ctx.sizes.synced
    setup = _setup(ctx, m, s.synced_precision, s.synced_batch, 1, 0)
    overrides = solo_overrides(setup, _jpegs(ctx), probe=True)
    cuda = ctx.device.type == "cuda"
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = solo_trainer(overrides, Path(run_dir), detect(), ctx.device)
        # The loader's batches as read, so that moving them is counted apart (the source moves them otherwise).
        batches, window = endless_loader(trainer.source), MetricsWindow(ctx.device)

        def step(index: int, counter) -> dict[str, list[str]]:
            """What `counter` (a context manager whose found() lists what it saw) sees in each part of one step of
            the trainer's loop."""
            batch, found = next(batches), {}
            with counter() as seen:
                moved = trainer._to_device(batch)
            found["moving the batch, its views made on the device (Trainer._to_device)"] = seen.found()
            with counter() as seen:
                out = trainer.train_step(moved, index)
            found["the step (TrainStep)"] = seen.found()
            with counter() as seen:
                window.add(out, moved)
            found["the loop's metrics (MetricsWindow.add)"] = seen.found()
            return found

        class Reads:
            def __enter__(self):
                self.reads = HostReads().__enter__()
                return self

            def __exit__(self, *exc):
                self.reads.__exit__(*exc)

            def found(self) -> list[str]:
                return [f"{what} at {where}" for what, where in self.reads.found]

        class Syncs:
            def __enter__(self):
                self.caught = warnings.catch_warnings(record=True)
                self.seen = self.caught.__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                return self

            def __exit__(self, *exc):
                torch.cuda.set_sync_debug_mode("default")
                self.caught.__exit__(*exc)

            def found(self) -> list[str]:
                return [
                    f"{str(w.message).splitlines()[0][:80]} at {Path(w.filename).name}:{w.lineno}"
                    for w in self.seen
                    if "called a synchronizing" in str(w.message)  # not set_sync_debug_mode's own warning
                ]

        for index in range(3):  # the first steps exchange the batch sizes, allocate, choose kernels
            trainer.train_step(trainer._to_device(next(batches)), index)
        counted = [("host reads (HostReads)", 3, step(3, Reads))]
        if cuda:
            torch.cuda.synchronize()
            counted.append(("synchronisations (torch.cuda.set_sync_debug_mode)", 4, step(4, Syncs)))
    lines = [
        f"One step of solo's training loop on a {m.label}, batch {s.synced_batch}, precision {s.synced_precision}, "
        f"on {ctx.device}, with the probe, data.augment_on=device, after 3 warm-up steps; not a logging step "
        "(the trainer reads its metrics every trainer.log_every_steps).",
        "",
        "| counted | step | part | count | where |",
        "|---|---|---|---|---|",
    ]
    for what, index, found in counted:
        for part, events in found.items():
            where = "; ".join(sorted(set(events))) or "-"
            lines.append(f"| {what} | {index} | {part} | {len(events)} | {where} |")
    return lines


def step_nccl(ctx: Context) -> list[str]:
    """W = 1 against W = every GPU, DDP and FSDP, over NCCL in float64: main_pretrain.py's weights after 3 steps."""
    from solo.distributed.checkpoint import read_checkpoint

    tiny = [
        "method=simclr",
        "data=synthetic",
        "data.image_size=32",
        "data.num_samples=256",
        "data.num_workers=2",
        "trainer.max_steps=3",
        "trainer.precision=64",
        "trainer.progress_bar=false",
        "trainer.plots=false",
        "optim.warmup_epochs=0",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ctx.gpus}", "--standalone"]

    def run(launcher: list[str], overrides: list[str], name: str) -> dict:
        run_dir = ctx.work / f"nccl-{name}"
        subprocess.run(
            [*launcher, "main_pretrain.py", *tiny, *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, check=True
        )
        model = read_checkpoint(run_dir / "checkpoints" / "last")["model"]
        return {k: v.double() for k, v in model.items() if v.is_floating_point()}

    one = run([sys.executable], [f"data.batch_size={16 * ctx.gpus}"], "one")
    lines = ["| strategy | processes | largest weight difference against 1 process |", "|---|---|---|"]
    for strategy in ("ddp", "fsdp"):
        many = run(torchrun, ["data.batch_size=16", f"trainer.strategy={strategy}"], strategy)
        worst = max(float((one[k] - many[k]).abs().max()) for k in one)
        lines.append(f"| {strategy} | {ctx.gpus} | {worst:.1e} |")
    return lines


@dataclasses.dataclass(frozen=True)
class Step:
    title: str
    limit_s: float
    run: object  # (Context) -> list of markdown lines
    needs: str = ""  # "gpus": runs only with 2 GPUs or more


STEPS = (
    Step("1. SyncBatchNorm: torch's against solo's global BatchNorm", 40, step_batchnorm),
    Step("2. Gradient accumulation in float64: trainer.accumulate=2 against 1", 45, step_accumulation),
    Step("3. Throughput and peak memory: solo against the bare model", 150, step_throughput),
    Step("4. Kernel launches per step: solo against the bare model", 60, step_launches),
    Step("5. The augmentation on the device against the CPU workers", 45, step_augmentation),
    Step("6. torch.compile: off, blocks, step", 330, step_compile),
    Step("7. Host syncs in a training step", 40, step_syncs),
    Step("8. W = 1 against W = N over NCCL", 120, step_nccl, needs="gpus"),
)

# -------------------------------------------------------------------------------------------------------- driver


@dataclasses.dataclass
class Outcome:
    status: str  # a sentence: finished, did not finish, failed, not run
    lines: list[str] = dataclasses.field(default_factory=list)


def render(path: Path, header: list[str], outcomes: dict[str, Outcome]) -> None:
    text = header + [""]
    for title, outcome in outcomes.items():
        text += [f"## {title}", "", f"_{outcome.status}_", ""]
        text += outcome.lines + ([""] if outcome.lines else [])
    partial = path.with_name(path.name + ".partial")
    partial.write_text("\n".join(text))
    partial.replace(path)  # a reader never sees half a report


def _child(step: Step, ctx: Context, result: Path, log: Path) -> None:
    os.setpgid(0, 0)  # its own group, so that the parent can end it with everything it started
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        lines = step.run(ctx)
        result.write_text(json.dumps({"lines": lines}))
    except BaseException as e:  # the report says why, the log has the traceback
        traceback.print_exc()
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        result.write_text(json.dumps({"error": f"{type(e).__name__}: {first_line}"}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()


def run_step(step: Step, ctx: Context, limit: float, log: Path) -> Outcome:
    result, step_log = ctx.work / "result.json", ctx.work / "step.log"
    result.unlink(missing_ok=True)
    step_log.write_text("")
    start = time.perf_counter()
    process = multiprocessing.get_context("fork").Process(target=_child, args=(step, ctx, result, step_log))
    process.start()
    try:
        os.setpgid(process.pid, process.pid)  # as the child does: whichever runs first
    except (ProcessLookupError, PermissionError):
        pass
    process.join(limit)
    timed_out = process.is_alive()
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the step, or what it left behind (data workers, compilers)
    except ProcessLookupError:
        pass
    process.join()
    seconds = time.perf_counter() - start
    output = step_log.read_text(errors="replace")
    with log.open("a") as f:
        f.write(f"== {step.title} ({seconds:.1f} s)\n{output}\n")
    tail = ["Its last output:", "", "```", *output.rstrip().splitlines()[-12:], "```"] if output.strip() else []
    if timed_out:
        return Outcome(f"did not finish: stopped after {limit:.3g} s, its limit", tail)
    found = json.loads(result.read_text()) if result.exists() else {"error": f"exit status {process.exitcode}"}
    if "error" in found:
        return Outcome(f"failed after {seconds:.1f} s: {found['error']}", tail)
    return Outcome(f"finished in {seconds:.1f} s (limit {limit:.3g} s)", found["lines"])


def versions() -> str:
    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return (
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, commit {commit or 'unknown (no git here)'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, at toy sizes")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--device-name", default="")
    parser.add_argument("--budget", type=float, default=530.0, help="seconds for all the steps together")
    parser.add_argument("--work", type=Path, required=True, help="a scratch folder (bench/gpu.sh removes it)")
    parser.add_argument("--note", action="append", default=[], help="a line for the report's header")
    args = parser.parse_args()
    deadline = time.perf_counter() + args.budget
    args.report = args.report.resolve()
    log = args.report.with_name(args.report.name + ".log")
    what = "dry run on the CPU at toy sizes" if args.dry_run else f"{args.device_name} x {args.gpus}"
    header = [f"# solo's GPU kit: {what}", ""]
    outcomes = {s.title: Outcome("did not finish: the kit stopped before this step ended") for s in STEPS}
    render(args.report, header, outcomes)
    # torch.cuda.is_available() asks NVML, not the CUDA runtime, whoever calls it here: a process that has called
    # the runtime cannot fork processes that use CUDA.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:  # once here, so that every step's process starts with them
        import torch  # noqa: F401

        sys.path.insert(0, str(BENCH))
        import data  # noqa: F401
        import throughput  # noqa: F401
        import timm  # noqa: F401
    except Exception as e:
        for title in outcomes:
            outcomes[title] = Outcome(f"not run: the kit could not import what it needs ({type(e).__name__}: {e})")
        render(args.report, header, outcomes)
        raise
    command = f"`bash bench/gpu.sh{' --dry-run' if args.dry_run else ''}`"
    header += [f"{versions()}; {command}, {args.budget:.0f} s for the steps.", *args.note]
    ctx = Context(args.dry_run, args.gpus, DRY if args.dry_run else GPU, args.work)
    override = os.environ.get("STEP_TIMEOUT")
    for step in STEPS:
        left = deadline - time.perf_counter()
        limit = min(float(override) if override else step.limit_s, left)
        if step.needs == "gpus" and args.gpus < 2:
            outcomes[step.title] = Outcome(
                "not run: "
                + ("the CPU (dry run)" if args.dry_run else "one GPU")
                + "; NCCL needs a GPU per process, 2 or more"
            )
        elif left < 1:
            outcomes[step.title] = Outcome(f"did not finish: not started, the kit's {args.budget:.0f} s were spent")
        else:
            print(f"== {step.title} (limit {limit:.3g} s)", file=sys.stderr, flush=True)
            outcomes[step.title] = run_step(step, ctx, limit, log)
            print(f"   {outcomes[step.title].status}", file=sys.stderr, flush=True)
        render(args.report, header, outcomes)


if __name__ == "__main__":
    main()
