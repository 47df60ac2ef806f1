#!/usr/bin/env python
"""Where solo's training step spends its time: per-step milliseconds of each part of the real loop, on one process
or under torchrun.

    python bench/overhead.py [--steps 20] [main_pretrain.py overrides ...]
    torchrun --nproc_per_node=2 bench/overhead.py data.batch_size=32          # the same global batch on 2 processes

The Trainer is built as `main_pretrain.py` builds it and its own loop (`fit`) runs; the parts are timed by wrapping
them: waiting for the next batch (the DataLoader, or the augmentation in the main process with data.num_workers=0),
moving it to the device, the forward (backbone, projector, loss, the probe's forward), the backward (DDP's gradient
all-reduce overlaps it and is inside it), the optimizer step (clipping included), the collectives solo calls from
Python (global BatchNorm's statistics and the losses' gathers, forward and backward; timed apart and also inside the
forward/backward they happen in), the probe's forward, and the logging steps (the host reads, the metrics' all-reduce
and the logger). Steps before `--warmup` and the run's end (evaluation, checkpoint) are left out. Rank 0's figures.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # solo from a checkout too, and bench/throughput.py

from throughput import compose_pretrain  # noqa: E402

import solo.distributed.collectives as collectives  # noqa: E402
from solo.distributed.env import process_group  # noqa: E402
from solo.train.trainer import Trainer  # noqa: E402

COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor", "broadcast")


class Clock:
    """Seconds per named part, counted only while `on`."""

    def __init__(self):
        self.seconds, self.on, self.depth = collections.defaultdict(float), False, 0

    @contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.on:
                self.seconds[name] += time.perf_counter() - start

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            with self.part(name):
                return fn(*args, **kwargs)

        return timed


def instrument(trainer: Trainer, clock: Clock, warmup: int) -> None:
    step, model = trainer.train_step, trainer.model
    source_iter = type(trainer.source).__iter__

    def timed_batches(source):
        batches = source_iter(source)
        while True:
            moving = clock.seconds["to device"]
            with clock.part("data wait"):
                batch = next(batches, None)
            if not source.ahead:  # moved inside next(): counted as "to device", not as waiting
                clock.seconds["data wait"] -= clock.seconds["to device"] - moving
            if batch is None:
                return
            yield batch

    type(trainer.source).__iter__ = timed_batches
    # Read ahead (views made on the device), in a thread of its own while the step runs: counted, but not waited for.
    trainer.source.prepare = clock.wrap("to device", trainer.source.prepare)
    trainer._log = clock.wrap("logging", trainer._log)
    if model.probe is not None:
        model.probe.forward = clock.wrap("probe forward", model.probe.forward)
    step.optimizer.step = clock.wrap("optimizer", step.optimizer.step)
    loss = step._loss
    step._loss = clock.wrap("forward", loss)
    scaled = step._scaled

    class Backward:  # the step calls .backward() on what _scaled returns (the loss, scaled under precision 16)
        def __init__(self, tensor):
            self.tensor = tensor

        def backward(self):
            with clock.part("backward"):
                self.tensor.backward()

    step._scaled = lambda t: Backward(scaled(t))
    for name in COLLECTIVES:
        setattr(dist, name, clock.wrap("collectives (Python)", getattr(dist, name)))
    for name in ("_all_gather", "_reduce_scatter"):  # bound when solo.distributed.collectives was imported
        setattr(collectives, name, clock.wrap("collectives (Python)", getattr(collectives, name)))

    class Counted:  # the trainer's step, counting the steps and switching the clock on after the warm-up
        done = 0

        def __getattr__(self, name):
            return getattr(step, name)

        def __call__(self, batch, index):
            clock.on = self.done >= warmup
            if self.done == warmup:
                clock.started = time.perf_counter()
            with clock.part("step"):
                out = step(batch, index)
            self.done += 1
            clock.ended, clock.steps = time.perf_counter(), self.done - warmup
            return out

    trainer.train_step = Counted()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps, after --warmup")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="main_pretrain.py overrides")
    args = parser.parse_args()
    cfg = compose_pretrain(
        [
            f"trainer.max_steps={args.warmup + args.steps}",
            "trainer.progress_bar=false",
            "trainer.plots=false",
            "trainer.checkpoint_every_steps=0",
            *args.overrides,
        ]
    )
    clock = Clock()
    with process_group() as (env, device), tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), env, device)
        instrument(trainer, clock, args.warmup)
        trainer.fit()
        if not env.is_main:
            return
        # The loop's wall time per step, from the first timed step's start to the last one's end: the logging and
        # the waits between steps included.
        wall = (clock.ended - clock.started) / clock.steps
        batch = trainer.source.global_batch
        print(
            f"{env.world_size} process(es), global batch {batch}: {1000 * wall:.0f} ms per step, {batch / wall:.1f} img/s"
        )
        print("| part | ms per step | share |")
        print("|---|---|---|")
        for name, seconds in sorted(clock.seconds.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {1000 * seconds / clock.steps:.1f} | {seconds / clock.steps / wall:.2f} |")


if __name__ == "__main__":
    main()
