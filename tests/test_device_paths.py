"""The CUDA-only paths of the trainer, run on CPU tensors: what CI can check of them without a GPU. (The views made
on the device are tested in test_train.py; torch's SyncBatchNorm, whose kernels exist only for CUDA, by
bench/gpu.sh.)"""

import torch

from solo.distributed.checkpoint import read_checkpoint
from solo.distributed.env import process_group
from solo.train.trainer import Trainer
from tests.test_train import TINY, compose_cfg, weights_at_init


def test_channels_last_gives_the_step_of_contiguous_tensors(tmp_path):
    """trainer.channels_last applies on CUDA only (its convolutions are faster so). Its path, the model's weights and
    every 4-D batch tensor in channels_last memory, run here on the CPU as Trainer runs it on a GPU: in float64 the
    weights after 3 steps equal those of contiguous tensors to 1e-10 of their movement."""
    overrides = TINY + ["trainer.precision=64", "data.batch_size=16", "trainer.max_steps=3"]
    cfg = compose_cfg(overrides)
    runs = {}
    for channels_last in (False, True):
        with process_group() as (env, device):
            trainer = Trainer(cfg, tmp_path / str(channels_last), env, device)
            if channels_last:  # what Trainer.__init__ does when the device is CUDA
                trainer.channels_last = True
                trainer.model.to(memory_format=torch.channels_last)
            trainer.fit()
            convolutions = [p for p in trainer.model.parameters() if p.dim() == 4]
            assert all(p.is_contiguous(memory_format=torch.channels_last) for p in convolutions) == channels_last
        runs[channels_last] = read_checkpoint(tmp_path / str(channels_last) / "checkpoints" / "last")["model"]
    start = weights_at_init(overrides)
    moved = max(float((runs[False][k] - start[k]).abs().max()) for k in start)
    worst = max(float((runs[False][k] - runs[True][k]).abs().max()) for k in start)
    assert moved > 0 and worst <= 1e-10 * moved, f"channels_last differs by {worst} (moved {moved})"
