"""Gradient checker: does a loss give, on W processes under DDP, the gradient of one process on the whole batch?

    python -m solo.distributed.check                      # the registered losses, W = 1, 2, 3, 4
    python -m solo.distributed.check mypkg.losses:my_loss # also your own loss

A loss under check is called as `fn(z1, z2)` on two (batch, features) float64 tensors produced by two
small encoders, and returns a scalar. Each W runs in real gloo process groups on the CPU, with different
data on every rank, once with equal per-rank batches and (W > 1) once with uneven ones. The reference
is the same model and loss in this process, without a process group, on the concatenated batch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from solo.distributed.env import destroy_process_group
from solo.losses import barlow_twins_loss, clip_loss, nt_xent_loss

TOLERANCE = 1e-10  # relative, float64
IN_FEATURES, HIDDEN, OUT_FEATURES = 5, 7, 4


@dataclass(frozen=True)
class Case:
    fn: Callable[..., torch.Tensor]
    learnable: dict[str, float] = field(default_factory=dict)  # scalar parameters passed to fn by name


def _nt_xent(z1, z2):
    return nt_xent_loss(z1, z2, temperature=0.3)


def _clip(z1, z2, logit_scale):
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), logit_scale)


def _barlow_twins(z1, z2):
    return barlow_twins_loss(z1, z2, lambd=0.05)


REGISTERED = {
    "nt_xent": Case(_nt_xent),
    "clip": Case(_clip, learnable={"logit_scale": 1 / 0.07}),  # the temperature is learnt, as in CLIP
    "barlow_twins": Case(_barlow_twins),
}


def resolve(spec: str) -> Case:
    if spec in REGISTERED:
        return REGISTERED[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ValueError(f"unknown loss {spec!r}: give one of {sorted(REGISTERED)} or 'module:function'")
    return Case(getattr(importlib.import_module(module_name), attr))


class TwoTowers(nn.Module):
    """Two small non-linear encoders and the case's learnable scalars, so every kind of parameter is checked."""

    def __init__(self, case: Case, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.case = case
        self.tower1 = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_FEATURES))
        self.tower2 = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_FEATURES))
        self.scalars = nn.ParameterDict({k: nn.Parameter(torch.tensor(v)) for k, v in case.learnable.items()})
        self.double()

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.case.fn(self.tower1(x1), self.tower2(x2), **dict(self.scalars))


def make_batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, IN_FEATURES, generator=g, dtype=torch.float64)
    return x1, x1 + 0.5 * torch.randn(n, IN_FEATURES, generator=g, dtype=torch.float64)


def _loss_and_grads(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor, names) -> tuple[float, dict]:
    loss = model(x1, x2)
    loss.backward()
    params = dict(model.named_parameters())
    return loss.item(), {n: params[n].grad.numpy().copy() for n in names}


def _layouts(world: int, uneven: bool) -> list[list[int]]:
    even = [4] * world
    if world == 1 or not uneven:
        return [even]
    return [even, [2 + (3 * r) % 5 for r in range(world)]]  # e.g. [2, 5, 3, 6]


def _rank_loss_and_grads(case: Case, layout: list[int], rank: int, seed: int) -> tuple[float, dict]:
    x1, x2 = make_batch(sum(layout), seed)
    start = sum(layout[:rank])
    model = TwoTowers(case, seed)
    ddp = nn.parallel.DistributedDataParallel(model)
    loss = ddp(x1[start : start + layout[rank]], x2[start : start + layout[rank]])
    loss.backward()
    # DDP averaged into model's own gradients; its names carry no "module." prefix.
    return loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def _worker(rank: int, world: int, store_path: str, specs: list[str], seed: int, uneven: bool, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        for spec in specs:
            for layout in _layouts(world, uneven):
                loss, grads = _rank_loss_and_grads(resolve(spec), layout, rank, seed)
                results.put((spec, tuple(layout), rank, loss, grads))
        dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        destroy_process_group()


@dataclass(frozen=True)
class Result:
    spec: str
    world_size: int
    layout: tuple[int, ...]
    loss_error: float  # |mean over ranks of the returned values - reference| / |reference|
    grad_error: float  # worst over ranks and parameters of max|g - g_ref|, over the largest |g_ref| of the model

    @property
    def ok(self) -> bool:
        return self.loss_error <= TOLERANCE and self.grad_error <= TOLERANCE


def run_check(specs: list[str], world: int, seed: int = 0, uneven: bool = True) -> list[Result]:
    """Check every spec at one world size (one spawned process group for all of them).

    uneven=False skips the layout with different per-rank batch sizes, for losses that cannot take it.
    """
    for spec in specs:
        resolve(spec)  # fail here, with the parent's traceback, on a bad name
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _worker, args=(world, os.path.join(tmp, "store"), specs, seed, uneven, queue), nprocs=world, start_method="spawn"
        )
    by_key: dict[tuple, list] = {}
    while not queue.empty():
        spec, layout, _, loss, grads = queue.get()
        by_key.setdefault((spec, layout), []).append((loss, grads))

    results = []
    for spec in specs:
        for layout in _layouts(world, uneven):
            per_rank = by_key[(spec, tuple(layout))]
            model = TwoTowers(resolve(spec), seed)
            names = [n for n, _ in model.named_parameters()]
            ref_loss, ref_grads = _loss_and_grads(model, *make_batch(sum(layout), seed), names)
            mean_loss = sum(loss for loss, _ in per_rank) / len(per_rank)
            loss_error = abs(mean_loss - ref_loss) / max(abs(ref_loss), 1e-300)
            # One scale for the whole model: some true gradients are exactly zero (a bias before a
            # standardisation), where a per-parameter ratio would compare rounding noise with itself.
            scale = max(float(np.abs(g).max()) for g in ref_grads.values())
            grad_error = max(float(np.abs(grads[n] - ref_grads[n]).max()) for _, grads in per_rank for n in names) / scale
            results.append(Result(spec, world, tuple(layout), loss_error, grad_error))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("losses", nargs="*", help="extra losses to check, as module:function")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--only", action="store_true", help="check only the losses named, not the registered ones")
    parser.add_argument("--even-only", action="store_true", help="skip uneven per-rank batches (if your loss needs equal ones)")
    args = parser.parse_args(argv)
    specs = list(args.losses) if args.only else list(REGISTERED) + list(args.losses)
    if not specs:
        parser.error("nothing to check: name a loss, or drop --only")

    print(f"{'loss':<40} {'W':>2}  {'batch per rank':<16} {'loss rel.err':>12} {'grad rel.err':>12}  verdict")
    failures = 0
    for world in args.world_sizes:
        for r in run_check(specs, world, uneven=not args.even_only):
            failures += not r.ok
            verdict = "ok" if r.ok else "MISMATCH"
            layout = ",".join(map(str, r.layout))
            print(f"{r.spec:<40} {r.world_size:>2}  {layout:<16} {r.loss_error:>12.1e} {r.grad_error:>12.1e}  {verdict}")
    print(f"tolerance {TOLERANCE:.0e} (relative, float64): " + ("all exact" if not failures else f"{failures} mismatches"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
