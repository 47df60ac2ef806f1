#!/usr/bin/env python
"""Samples/s of solo's whole SimCLR training step against the limit: a bare PyTorch loop doing the same work, on 1
and on N processes, at the same global batch.

    python bench/throughput.py --image-size 16 --default-job                 # the default digits job, 1 and 2 processes
    python bench/throughput.py --small-stem false --image-size 64            # ResNet-18 at 64 px, batch 64
    python bench/throughput.py --backbone resnet50 --small-stem false --image-size 224 --device cuda --jpegs 512 --nproc 1

The limit: two views of random tensors already in memory, backbone forward + backward, a projector
(Linear-BN-ReLU-Linear), NT-Xent, an SGD step; nothing else. On N > 1 processes (torchrun) it is the bare
data-parallel loop: DDP, BatchNorm per process, NT-Xent of each process's rows against the global batch through
torch's gradient-preserving all-gather. solo: its Trainer (the model, its data loader, `TrainStep`) stepping in a loop
as `Trainer.fit` does, without the logging and checkpoints: `method=simclr optim=sgd trainer.probe=false` with the
same backbone, projector sizes, batch and precision on `data=synthetic` (images generated and augmented by the
data loader); or with `--default-job` main_pretrain.py's defaults as they are (the digits, augmented in the
main process, LARS, the online probe), only the batch set; or with `--jpegs N` N JPEG files of 400x300 px read with
`data.augment_on=device`: the workers only read the files' bytes, the device decodes them (nvJPEG on a GPU) and makes
the views, so the data path keeps up with a GPU (bench/data.py measures both paths). On N > 1 processes solo also runs
with `trainer.sync_batchnorm=false`: what its exact global BatchNorm costs. On CUDA both use channels_last, as solo
does there (`trainer.channels_last`).

The loops are built side by side in the same processes and timed in turns (`--rounds` turns of `--steps` steps
each, the order reversed every other round): on a shared machine whose speed drifts by 10-20 % from one minute to
the next, separate runs compare the drift, turns compare the loops. Samples/s are all processes' together (on the
CPU they share the machine's cores); solo / bare compares the two at the same number of processes. `bare` and `solo`
time one loop alone, with its peak memory (bench/gpu.py's throughput step).
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
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.nn.functional import all_gather

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # solo from a checkout too, and bench/data.py

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
    # solo runs main_pretrain.py's defaults (the digits at 16 px, their augmentation in the main process, LARS, the
    # online probe), only the batch set; the bare loop: ResNet-18 with the small stem at 16 px, as those defaults.
    default_job: bool = False


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


def bare(s: Setup, env: DistEnv | None = None) -> Measured:
    """The limit's rate on this process (see bare_step)."""
    step, build_s = bare_step(s, env)
    return timed(step, s, torch.device(s.device), s.batch * (env.world_size if env else 1), build_s)


def bare_step(s: Setup, env: DistEnv | None = None, views_apart: bool = False):
    """The limit's step, `step(index)`, and the seconds it took to build: on this process, `s.batch` rows of two
    views, through the model in one call (BatchNorm's statistics over both views together), or with `views_apart`
    each view with its own BatchNorm statistics, as solo's methods normalise them: a call per view of each part that
    has BatchNorm (the projector; a ResNet), one call of each that has none (a ViT). With `env` of W > 1 processes
    (torchrun), the bare data-parallel loop: DDP, BatchNorm per process (torch's SyncBatchNorm runs on GPUs only), and
    NT-Xent over the global batch through torch's gradient-preserving all-gather (each process's rows against every
    process's). torch's fused SGD kernel, as solo's."""
    device = torch.device(s.device)
    world, rank = (env.world_size, env.rank) if env else (1, 0)
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
    apart = [any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in part.modules()) for part in model]
    if world > 1 and views_apart:
        raise ValueError("views_apart: a one-process loop (bench/launches.py)")
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    views = torch.randn(2 * s.batch, 3, s.image_size, s.image_size, device=device).to(memory_format=fmt)
    # Row i of this process's 2b rows is row 2b * rank + i of the gathered 2B; its positive is the other view's.
    mine = torch.arange(2 * s.batch, device=device)
    positives = 2 * s.batch * rank + mine.roll(s.batch)
    is_self = torch.zeros(2 * s.batch, 2 * s.batch * world, dtype=torch.bool, device=device)
    is_self[mine, 2 * s.batch * rank + mine] = True
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.precision == "bf16")
    build_s = time.perf_counter() - start

    def step(index: int) -> None:
        with autocast:
            x = views
            for part, per_view in zip(model, apart) if views_apart else [(model, False)]:
                x = torch.cat([part(v) for v in x.chunk(2)]) if per_view else part(x)
            z = F.normalize(x.float(), dim=1)
        candidates = torch.cat(all_gather(z)) if world > 1 else z
        logits = (z @ candidates.T / 0.2).masked_fill(is_self, float("-inf"))
        loss = F.cross_entropy(logits, positives)  # the mean over this process's rows; DDP averages the processes
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, build_s


def solo_overrides(s: Setup, jpegs: Path | None, probe: bool = False) -> list[str]:
    """main_pretrain.py's overrides for `s`: SimCLR with SGD, without the online probe (the bare model has none)
    unless `probe`; synthetic images, or the JPEG folder `jpegs` (bench/data.py's make_images) augmented on the
    device."""
    if s.default_job:
        return [f"data.batch_size={s.batch}", "trainer.plots=false", "trainer.progress_bar=false"]
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
    """The train source's batches, on the device, epoch after epoch."""
    while True:
        yield from source
        source.set_epoch(source.epoch + 1)


def endless_loader(source):
    """The train loader's batches as read, not yet on the device (Trainer._to_device moves them), over and over."""
    while True:
        yield from source.loader


def solo_trainer(overrides: list[str], run_dir: Path, env: DistEnv, device: torch.device) -> Trainer:
    return Trainer(compose_pretrain(overrides), run_dir, env, device)


def solo(s: Setup, env: DistEnv, jpegs: Path | None = None, more: list[str] = ()) -> Measured:
    """solo's rate in this process (one of env.world_size; see solo_step)."""
    with solo_step(s, env, jpegs, more) as (step, build_s, _, _):
        return timed(step, s, torch.device(s.device), s.batch * env.world_size, build_s)


@contextmanager
def solo_step(s: Setup, env: DistEnv, jpegs: Path | None = None, more: list[str] = (), held: bool = False):
    """solo's step in this process (one of env.world_size), `step(index)`, as Trainer.fit steps: a batch from its
    source, on the device (the views made there with data.augment_on=device, the next batch's in a thread while this
    one trains), TrainStep; the seconds it took to build, how many batches its loader's workers read ahead, and a
    reader of the CPU seconds those workers used so far. `held`: every step trains on the first batch, read once: the
    step without the data's cost. `step(index, again=True)` trains on the batch of the step before, without reading
    one (the step alone, on the same Trainer: a compiled step is not compiled again)."""
    device = torch.device(s.device)
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        trainer = solo_trainer(solo_overrides(s, jpegs) + list(more), Path(run_dir), env, device)
        build_s = time.perf_counter() - start
        batches = endless(trainer.source)
        first = next(batches) if held else None
        try:
            loader = trainer.source.loader
            ahead = loader.num_workers * (loader.prefetch_factor or 0) if not held else 0
            last = first

            def step(index: int, again: bool = False):
                nonlocal last
                if not (held or again):
                    last = next(batches)
                return trainer.train_step(last, index)

            yield step, build_s, ahead, lambda: workers_cpu_seconds(loader)
        finally:
            batches.close()
            stop_workers(trainer.source)


def workers_cpu_seconds(loader) -> float:
    """The CPU seconds (user and system) that `loader`'s live worker processes used so far; 0 without workers."""
    total = 0.0
    for process in getattr(getattr(loader, "_iterator", None), "_workers", []):
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()  # Linux: utime, stime
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def interleaved(steps: dict, s: Setup, samples_per_step: int, rounds: int) -> tuple[dict[str, float], float]:
    """Samples/s of each of `steps` (name -> (step(index), batches read ahead, its workers' CPU seconds so far)),
    timed in turns: each loop's `s.warmup` steps, then `rounds` rounds of `s.steps` steps of each loop (the order
    reversed every other round), so that a slow spell of the machine falls on every loop alike. A loop whose data
    workers read batches ahead made them during the others' turns: its turn starts with that many steps untimed.
    Also the CPU seconds solo's data workers used per step over the rounds (0 without workers)."""
    device = torch.device(s.device)
    for step, *_ in steps.values():
        for index in range(s.warmup):
            step(index)
    seconds, names, index = dict.fromkeys(steps, 0.0), list(steps), s.warmup
    workers_cpu, solo_steps = steps["solo"][2](), 0
    for turn in range(rounds):
        for name in names if turn % 2 == 0 else names[::-1]:
            step, ahead, _ = steps[name]
            if name == "solo":
                solo_steps += ahead + s.steps
            for _ in range(ahead):
                step(index)
                index += 1
            synchronize(device)
            start = time.perf_counter()
            for _ in range(s.steps):
                step(index)
                index += 1
            synchronize(device)
            seconds[name] += time.perf_counter() - start
    rates = {name: samples_per_step * s.steps * rounds / seconds[name] for name in names}
    return rates, (steps["solo"][2]() - workers_cpu) / solo_steps


def compared(s: Setup, env: DistEnv, jpegs: Path | None, more: list[str], rounds: int) -> tuple[dict, float]:
    """The bare loop, solo, solo on one batch read once (what the data costs: the views made, on the CPU in the
    step's time), and on W > 1 processes solo with trainer.sync_batchnorm=false (what its exact global BatchNorm
    costs), in this process, interleaved: samples/s of each, all processes together; and the CPU seconds a step
    of solo's data workers in this process."""

    def loop(*args, **kwargs):  # (step, batches read ahead, its workers' CPU seconds so far)
        step, _, ahead, workers_cpu = stack.enter_context(solo_step(*args, **kwargs))
        return step, ahead, workers_cpu

    with ExitStack() as stack:
        steps = {"bare": (bare_step(s, env if env.world_size > 1 else None)[0], 0, lambda: 0.0)}
        steps["solo"] = loop(s, env, jpegs, more)
        steps["held"] = loop(s, env, jpegs, more, held=True)
        if env.world_size > 1:
            steps["local"] = loop(s, env, jpegs, [*more, "trainer.sync_batchnorm=false"])
        return interleaved(steps, s, s.batch * env.world_size, rounds)


def worker(job: str, more: list[str]) -> None:
    """One rank of a torchrun launch of this file (`job`: the Setup, the JPEG folder and the rounds, as JSON): the
    loops' rates, printed by rank 0."""
    job = json.loads(job)
    with process_group() as (env, device):
        s = Setup(**{**job["setup"], "device": str(device)})
        rates, workers_cpu = compared(s, env, job["jpegs"] and Path(job["jpegs"]), more, job["rounds"])
        if env.is_main:
            print(json.dumps([rates, workers_cpu]))


def launched(s: Setup, nproc: int, jpegs: Path | None, more: list[str], rounds: int) -> tuple[dict, float]:
    """`compared` on `nproc` processes of `s.batch` rows each, through torchrun."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
    job = json.dumps({"setup": dataclasses.asdict(s), "jpegs": jpegs and str(jpegs), "rounds": rounds})
    out = subprocess.run(
        [*launcher, __file__, "--worker", job, *more], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    rates, workers_cpu = json.loads(out.strip().splitlines()[-1])  # rank 0's
    return rates, workers_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--small-stem", type=lambda s: s.lower() == "true", default=True)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64, help="the global batch: each of N processes takes batch / N")
    parser.add_argument("--proj-hidden", type=int, default=2048)
    parser.add_argument("--proj-output", type=int, default=128)
    parser.add_argument("--precision", choices=["32", "bf16"], default="32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="process counts")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each loop's turn")
    parser.add_argument("--rounds", type=int, default=6, help="turns of each loop, interleaved")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--jpegs", type=int, default=0, help="solo reads this many JPEGs (0: data=synthetic)")
    parser.add_argument(
        "--default-job",
        action="store_true",
        help="solo runs main_pretrain.py's defaults (digits, LARS, the probe); use with --image-size 16",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a torchrun rank's job, as JSON
    parser.add_argument("solo_overrides", nargs="*", help="more main_pretrain.py overrides, e.g. data.num_workers=0")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.solo_overrides)
    jpegs = None
    if args.jpegs:
        jpegs = REPO / ".bench" / f"jpegs-{args.jpegs}"
        make_images(jpegs, args.jpegs, 300)
    solo_data = (
        "main_pretrain.py's defaults"
        if args.default_job
        else f"{args.jpegs} JPEGs, views on the device"
        if jpegs
        else "synthetic"
    )
    print(
        f"{args.backbone} (small stem {args.small_stem}), {args.image_size} px, global batch {args.batch}, precision "
        f"{args.precision}, {args.device}, {os.cpu_count()} CPUs ({torch.get_num_threads()} torch threads in one "
        f"process); solo: {solo_data}"
    )
    print("| run | processes | samples/s | per process | solo / bare |")
    print("|---|---|---|---|---|")
    for nproc in args.nproc:
        s = Setup(
            args.backbone,
            args.small_stem,
            args.image_size,
            args.batch // nproc,
            args.precision,
            args.device,
            args.steps,
            args.warmup,
            proj_hidden=args.proj_hidden,
            proj_output=args.proj_output,
            default_job=args.default_job,
        )
        if nproc == 1:
            rates, workers_cpu = compared(s, detect(), jpegs, args.solo_overrides, args.rounds)
        else:
            rates, workers_cpu = launched(s, nproc, jpegs, args.solo_overrides, args.rounds)
        names = {
            "bare": "bare loop" + (" (DDP, all-gather NT-Xent)" if nproc > 1 else ""),
            "solo": "solo, method=simclr",
            "held": "solo, one batch read once (the step without the data)",
            "local": "solo, trainer.sync_batchnorm=false",
        }
        for key, rate in rates.items():
            print(
                f"| {names[key]} | {nproc} | {rate:,.1f} | {rate / nproc:,.1f} | {rate / rates['bare']:.2f} |",
                flush=True,
            )
        if workers_cpu:  # their CPU time comes out of the model's where the model keeps the cores busy
            cores = max(1, len(os.sched_getaffinity(0)) // nproc)
            share = workers_cpu / (cores * args.batch / rates["held"])  # of a process's cores in a step without data
            print(
                f"solo's data workers: {1e3 * workers_cpu:.0f} ms of CPU a step (rank 0's), {share:.0%} of the time of "
                f"its process's {cores} cores in a step without the data: where the model keeps those busy, solo / "
                f"bare is at most {rates['held'] / rates['bare'] / (1 + share):.2f} (the step without the data's "
                f"ratio over 1 + that share)",
                flush=True,
            )


if __name__ == "__main__":
    main()
