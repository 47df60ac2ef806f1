"""trainer.strategy: FSDP2 gives the step of one process on the whole batch, as DDP does, with ranks holding
uneven numbers of rows or none (tests/step_layouts.py); a LARS that takes its norms on the shards does not."""

import subprocess
import sys

import pytest
import torch

from tests.test_clip import TINY_CLIP
from tests.test_methods import BASE, METHOD
from tests.test_train import REPO, TINY, weights_at_init

STEPS = 3
SIMCLR = TINY + ["method=simclr", "trainer.precision=64"]  # LARS, BatchNorm in the backbone and the projector
# EMA teacher, multi-crop, centre, frozen last layer, and a gradient clip that binds
DINO = BASE + ["method=dino", *METHOD["dino"], "optim.grad_clip=0.3"]
CLIP = TINY_CLIP + ["trainer.precision=64"]  # two towers and the logit scale
CASES = {"simclr": SIMCLR, "dino": DINO, "clip": CLIP}


def step_layout(tmp_path, overrides: list[str], layout: list[int]) -> dict:
    """The whole weights after STEPS steps with the global batch split over len(layout) processes as `layout`."""
    out = tmp_path / f"{'-'.join(map(str, layout))}.pt"
    script = [str(REPO / "tests" / "step_layouts.py"), str(out), ",".join(map(str, layout)), str(STEPS), *overrides]
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={len(layout)}", "--standalone"]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PATH": ""}
    proc = subprocess.run([*launcher, *script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {k: v for k, v in torch.load(out, weights_only=True).items() if v.is_floating_point()}


def worst_difference(a: dict, b: dict) -> tuple[float, str]:
    assert a.keys() == b.keys()
    return max((float((a[k] - b[k]).abs().max()), k) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(CASES))
def test_fsdp_step_equals_one_process_with_uneven_and_empty_ranks(tmp_path, method):
    """3 float64 steps on 12 rows: FSDP at W = 2 ([9, 3]) and W = 3 ([8, 0, 4]) == 1 process, to 1e-10 of how far
    the weights moved."""
    overrides = CASES[method]
    one = step_layout(tmp_path, overrides, [12])
    start = weights_at_init(overrides + ["data.batch_size=12"])
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    for layout in ([9, 3], [8, 0, 4]):
        sharded = step_layout(tmp_path, overrides + ["trainer.strategy=fsdp"], layout)
        worst, name = worst_difference(one, sharded)
        assert worst <= 1e-10 * moved, f"{method}, FSDP {layout}: {name} differs by {worst} (moved {moved})"


@pytest.mark.slow
def test_lars_on_shard_norms_is_not_the_one_process_step(tmp_path):
    """The pitfall: LARS's trust ratio from each rank's shard of a weight (tests/shard_norm_lars.py), not the whole."""
    one = step_layout(tmp_path, SIMCLR, [12])
    wrong = ["imports=[tests.shard_norm_lars]", "optim.name=lars_shard_norms", "trainer.strategy=fsdp"]
    worst, name = worst_difference(one, step_layout(tmp_path, SIMCLR + wrong, [9, 3]))
    assert worst > 1e-6, f"shard norms gave the whole-tensor step ({name}: {worst})"
