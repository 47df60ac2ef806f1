"""Gradient checker: does a loss give, on W processes under DDP, the gradient of one process on the whole batch?

    python -m solo.losses.check                        # the registered losses, W = 1, 2, 3, 4
    python -m solo.losses.check mypkg.losses:my_loss   # also your own loss
    python -m solo.losses.check --only mypkg.losses:my_siglip --world-sizes 2 4

A loss under check is called as `fn(z1, z2, **scalars)` on two (batch, features) float64 tensors
produced by two small encoders, and returns a scalar; in a process group the ranks' values must sum to
W times the global loss (each returns W times its share, or the whole loss through solo's differentiable
collectives: see solo.distributed.collectives). A plain `fn(z1, z2)` is checked as it is.
To check learnable scalars too (a logit scale, a bias), register the loss in the module you name:

    from solo.losses import LOSSES

    @LOSSES.register("my_siglip", learnable={"logit_scale": 10.0, "bias": -10.0})
    def my_siglip(z1, z2, logit_scale, bias): ...

Each scalar then becomes a parameter with that initial value, passed by keyword, whose gradient is
checked with the encoders'. Each W runs in real gloo process groups on the CPU, with different data on
every rank, once with equal per-rank batches and (W > 1) once with uneven ones and once with the last rank empty. The reference is the
same model and loss in this process, without a process group, on the concatenated batch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from solo.distributed.env import destroy_process_group
from solo.errors import ConfigError
from solo.losses import LOSSES

TOLERANCE = 1e-10  # relative, float64
IN_FEATURES, HIDDEN, OUT_FEATURES = 5, 7, 4


def resolve(spec: str) -> SimpleNamespace:
    """A registered name or 'module:function' -> .name, .target and .learnable (name -> initial value)."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        # Importing the module runs its @LOSSES.register decorators, which carry the learnable scalars.
        fn = getattr(importlib.import_module(module_name), attr)
        entry = next((e for e in LOSSES if e.target is fn), SimpleNamespace(name=spec, target=fn))
    elif spec in LOSSES:
        entry = LOSSES[spec]
    else:
        raise ConfigError(f"unknown loss {spec!r}: give one of {', '.join(LOSSES.names())} or 'module:function'")
    return SimpleNamespace(name=entry.name, target=entry.target, learnable=dict(getattr(entry, "learnable", {})))


class TwoTowers(nn.Module):
    """Two small non-linear encoders and the case's learnable scalars, so every kind of parameter is checked."""

    def __init__(self, case: SimpleNamespace, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.loss = case.target
        self.tower1 = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_FEATURES))
        self.tower2 = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_FEATURES))
        self.scalars = nn.ParameterDict({k: nn.Parameter(torch.tensor(float(v))) for k, v in case.learnable.items()})
        self.double()

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.loss(self.tower1(x1), self.tower2(x2), **dict(self.scalars))


def make_batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, IN_FEATURES, generator=g, dtype=torch.float64)
    return x1, x1 + 0.5 * torch.randn(n, IN_FEATURES, generator=g, dtype=torch.float64)


def _layouts(world: int, uneven: bool, empty_rank: bool = True) -> list[list[int]]:
    """Equal per-rank batches; with `uneven` (W > 1) also unequal ones, and (`empty_rank`) one with the last rank empty."""
    even = [4] * world
    if world == 1 or not uneven:
        return [even]
    return [even, [2 + (3 * r) % 5 for r in range(world)]] + [
        [5] * (world - 1) + [0]
    ] * empty_rank  # [2, 5, 3, 6], [5, 5, 5, 0]


def _reference(spec: str, layout: list[int], seed: int) -> tuple[float, dict]:
    """Loss and gradients of one process on the whole batch, computed before any worker starts, so
    that a loss that raises or ignores one of its scalars fails here with a plain traceback."""
    model = TwoTowers(resolve(spec), seed)
    loss = model(*make_batch(sum(layout), seed))
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    if unused:
        raise ConfigError(f"loss {spec!r} does not depend on {', '.join(unused)}: nothing to check there")
    return loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def _rank_loss_and_grads(case: SimpleNamespace, layout: list[int], rank: int, seed: int) -> tuple[float, dict]:
    x1, x2 = make_batch(sum(layout), seed)
    start = sum(layout[:rank])
    model = TwoTowers(case, seed)
    ddp = nn.parallel.DistributedDataParallel(model)
    loss = ddp(x1[start : start + layout[rank]], x2[start : start + layout[rank]])
    loss.backward()
    # DDP averaged into model's own gradients; its names carry no "module." prefix.
    return loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def _worker(rank: int, world: int, store_path: str, modules, specs, seed: int, layouts, results) -> None:
    torch.set_num_threads(1)
    # A fresh interpreter: import the modules whose decorators registered the losses named here.
    for module in modules:
        importlib.import_module(module)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        for spec in specs:
            for layout in layouts:
                loss, grads = _rank_loss_and_grads(resolve(spec), layout, rank, seed)
                results.put((spec, tuple(layout), rank, loss, grads))
        dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        destroy_process_group()


def worker_context():
    """The multiprocessing context for process groups on this machine: workers forked from one server process that
    imported torch and this module once. A spawned interpreter pays for those imports (seconds) at every start; a
    checker run starts two groups per world size, so this is most of its time. Forking from the server, not from the
    caller, keeps whatever threads the caller started out of the workers."""
    context = mp.get_context("forkserver")
    # Read when the server starts (this process's first group). By name: run as `python -m`, __name__ is "__main__".
    context.set_forkserver_preload(["solo.losses.check"])
    return context


def _run_workers(world: int, specs: list[str], seed: int, layouts: list[list[int]]) -> dict[tuple, list]:
    """Every rank's (loss, gradients) per (spec, layout), from `world` gloo processes.

    A worker that raises ends the run with torch's ProcessRaisedException (the others are terminated).
    """
    modules = sorted({resolve(spec).target.__module__ for spec in specs})
    queue = worker_context().SimpleQueue()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        args = (world, os.path.join(tmp, "store"), modules, specs, seed, layouts, queue)
        context = mp.start_processes(_worker, args=args, nprocs=world, start_method="forkserver", join=False)
        try:
            # Read while the workers run: put() blocks once the pipe is full, so a join before
            # reading deadlocks as soon as the results outgrow the pipe's buffer (~64 KiB).
            while not context.join(timeout=0.05):
                while not queue.empty():
                    rows.append(queue.get())
        finally:
            for process in context.processes:  # e.g. KeyboardInterrupt: leave no worker behind
                if process.is_alive():
                    process.kill()
    while not queue.empty():  # what was written between the last read and the workers' exit
        rows.append(queue.get())
    by_key: dict[tuple, list] = {}
    for spec, layout, _, loss, grads in rows:
        by_key.setdefault((spec, layout), []).append((loss, grads))
    return by_key


@dataclass(frozen=True)
class Result:
    spec: str
    world_size: int
    layout: tuple[int, ...]
    loss_error: float  # |mean over ranks of the returned values - reference| / |reference|
    param_errors: dict[
        str, float
    ]  # per parameter, worst over ranks of max|g - g_ref|, over the model's largest |g_ref|

    @property
    def grad_error(self) -> float:
        return max(self.param_errors.values())

    @property
    def worst(self) -> str:
        """The parameter whose gradient is furthest from the reference, e.g. 'scalars.bias'."""
        return max(self.param_errors, key=self.param_errors.get)

    @property
    def ok(self) -> bool:
        return self.loss_error <= TOLERANCE and self.grad_error <= TOLERANCE


def _compare(spec: str, world: int, layout: list[int], reference: tuple[float, dict], per_rank: list) -> Result:
    ref_loss, ref_grads = reference
    mean_loss = sum(loss for loss, _ in per_rank) / len(per_rank)
    loss_error = abs(mean_loss - ref_loss) / max(abs(ref_loss), 1e-300)
    # One scale for the whole model: some true gradients are exactly zero (a bias before a
    # standardisation), where a per-parameter ratio would compare rounding noise with itself.
    scale = max(float(np.abs(g).max()) for g in ref_grads.values())
    errors = {n: max(float(np.abs(grads[n] - g).max()) for _, grads in per_rank) / scale for n, g in ref_grads.items()}
    return Result(spec, world, tuple(layout), loss_error, errors)


def run_check(
    specs: list[str], world: int, seed: int = 0, uneven: bool = True, empty_rank: bool = True
) -> list[Result]:
    """Check every spec at one world size (one process group for all of them).

    uneven=False skips the layouts with different per-rank batch sizes (one of them with an empty rank), for losses
    that cannot take them; empty_rank=False only the one with an empty rank.
    """
    specs = list(dict.fromkeys(specs))  # a loss named twice is checked once
    cases = [(spec, layout) for spec in specs for layout in _layouts(world, uneven, empty_rank)]
    references = {(spec, tuple(layout)): _reference(spec, layout, seed) for spec, layout in cases}
    even, *uneven_layouts = _layouts(world, uneven, empty_rank)
    per_rank = _run_workers(world, specs, seed, [even])
    if uneven_layouts:  # in process groups of their own: a loss that needs equal batches fails alone
        try:
            per_rank |= _run_workers(world, specs, seed, uneven_layouts)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            last = str(e).strip().splitlines()[-1]
            raise ConfigError(
                f"with uneven per-rank batches at W={world} ({' or '.join(map(str, uneven_layouts))}) "
                f"a worker failed ({last}): if your loss needs equal per-rank batches, check it with --even-only"
            ) from None
    return [_compare(s, world, lay, references[(s, tuple(lay))], per_rank[(s, tuple(lay))]) for s, lay in cases]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("losses", nargs="*", help="extra losses to check: module:function, or a registered name")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--only", action="store_true", help="check only the losses named, not the registered ones")
    parser.add_argument(
        "--even-only", action="store_true", help="skip uneven per-rank batches (if your loss needs equal ones)"
    )
    args = parser.parse_args(argv)
    specs = list(dict.fromkeys(args.losses if args.only else LOSSES.names() + args.losses))
    if not specs:
        parser.error("nothing to check: name a loss, or drop --only")

    width = max(40, *map(len, specs))
    print(f"{'loss':<{width}} {'W':>2}  {'batch per rank':<16} {'loss rel.err':>12} {'grad rel.err':>12}  verdict")
    failures = 0
    try:
        for world in args.world_sizes:
            for r in run_check(specs, world, uneven=not args.even_only):
                failures += not r.ok
                # On a mismatch, name the parameter furthest off: an encoder's, or a learnable scalar.
                verdict = "ok" if r.ok else f"MISMATCH (worst: {r.worst})"
                layout = ",".join(map(str, r.layout))
                print(
                    f"{r.spec:<{width}} {r.world_size:>2}  {layout:<16} {r.loss_error:>12.1e} {r.grad_error:>12.1e}  {verdict}"
                )
    except ConfigError as e:  # an unknown name, a scalar the loss ignores: the message says it all
        parser.error(str(e))
    print(
        f"tolerance {TOLERANCE:.0e} (relative, float64): " + ("all exact" if not failures else f"{failures} mismatches")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
