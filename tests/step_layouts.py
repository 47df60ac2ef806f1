"""A few training steps of the pretraining Trainer on the same global batches however they are split over ranks, for
tests: every rank draws the whole batch from a one-process loader and keeps its rows of a given layout (uneven, or a
rank with none), which the data pipeline never produces. Rank 0 writes the whole weights to OUT. Several such jobs
run one after another in one launch and one process group, which pays for the processes' start once.

    torchrun --nproc_per_node=W tests/step_layouts.py JOBS.json STEPS   # [[OUT, [rows per rank], [override, ...]], ...]
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from solo.distributed.env import process_group
from solo.train.loaders import build_loaders, build_splits
from solo.train.trainer import Trainer
from tests.test_train import compose_cfg


class Unremembered(dict):
    """For TrainStep.batch_sizes: every call exchanges the sizes. The step remembers them by local size, which
    assumes what the trainer guarantees and these layouts break: every rank has the same batch size."""

    def __contains__(self, key) -> bool:
        return False

    def __setitem__(self, key, value) -> None:
        pass


def rows(x, start: int, n: int):
    return [rows(v, start, n) for v in x] if isinstance(x, list) else x[start : start + n]


def step(env, device, out: str, layout: list[int], steps: int, overrides: list[str]) -> None:
    # The same global batch size at every W (the lr scaling and the epoch length depend on it).
    assert sum(layout) % len(layout) == 0, f"{layout}: the rows must be a multiple of the ranks"
    assert env.world_size == len(layout), f"{env.world_size} processes for a layout of {len(layout)}"
    cfg = compose_cfg([*overrides, f"data.batch_size={sum(layout) // len(layout)}"])
    trainer = Trainer(cfg, Path(out), env, device)
    trainer.train_step.batch_sizes = Unremembered()
    one = dataclasses.replace(env, rank=0, local_rank=0, world_size=1)
    data = cfg.data.copy()
    data.batch_size = sum(layout)
    splits = build_splits(data, one, cfg.trainer.seed, pairs=trainer.model.method.inputs == "image_text")
    loaders = build_loaders(
        splits,
        data,
        cfg.augmentation.views,
        one,
        seed=cfg.trainer.seed,
        spec=trainer.model.method.batch_spec(),
        knn=False,
        device=device,
    )
    start = sum(layout[: env.rank])
    for index, batch in zip(range(steps), loaders.train):
        mine = {key: rows(value, start, layout[env.rank]) for key, value in batch.items()}
        trainer.train_step(trainer._to_device(mine), index)
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)  # FSDP's shards gathered, on rank 0
    weights = get_model_state_dict(trainer.model, options=whole)
    if env.is_main:
        torch.save(weights, out)


def main(jobs_file: str, steps: str) -> None:
    with process_group() as (env, device):
        for out, layout, overrides in json.loads(Path(jobs_file).read_text()):
            step(env, device, out, layout, int(steps), overrides)


if __name__ == "__main__":
    main(*sys.argv[1:])
