"""The step's collectives and their arithmetic on 2 gloo ranks (tests/collectives_probe.py): gradient clipping and LARS
under FSDP reduce all the shards' norms of a step in one all-reduce, not one per parameter, and step as on whole
tensors; solo's fused and foreach optimizers take FSDP's shards and whole parameters in one group; DDP reduces what
GradCache accumulates past its wrapper."""

import json
import subprocess

import pytest

from tests.test_train import REPO, forked


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """What tests/collectives_probe.py found on each of 2 ranks."""
    root = tmp_path_factory.mktemp("collectives")
    launcher = forked(2)
    script = [str(REPO / "tests" / "collectives_probe.py"), str(root / "out.json"), str(root / "runs")]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PATH": ""}
    proc = subprocess.run([*launcher, *script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((root / "out.json").read_text())


@pytest.mark.slow
@pytest.mark.processes
def test_clipping_reduces_all_shards_once_and_gives_the_whole_tensors_norm(probed):
    """A model FSDP shards but for a 2-D and a 0-dim parameter left whole, float64: clip_grad_norm issues one
    all-reduce, and gives the norm and clipped gradients of an unsharded copy (1e-15); gathering each shard's norm
    (solo's clipping before) issues one per sharded gradient. One FSDP step of MAE with optim.grad_clip=1.0: one
    collective for its 95 sharded gradients, the norm of the per-parameter gathering exactly."""
    for rank in probed:
        toy, mae = rank["toy"], rank["mae"]
        assert toy["clip"] == 1 and toy["clip_per_parameter"] == toy["sharded_grads"] == 4, toy
        assert toy["clip_total_error"] <= 1e-15 and toy["clip_grad_error"] <= 1e-15, toy
        assert mae["clip"] == 1 and mae["clip_per_parameter"] == mae["sharded_grads"] > 1, mae
        assert mae["clip_total_relative_error"] <= 1e-14, mae


@pytest.mark.slow
@pytest.mark.processes
def test_lars_reduces_all_norms_of_a_step_once_and_steps_as_on_whole_tensors(probed):
    """Three float64 LARS steps of that model (an adapted group with a whole parameter among the shards, an excluded
    group with its own weight decay and momentum): one all-reduce per step, the weights of a hand-written
    per-parameter LARS on the whole tensors (1e-14 of how far they moved); LARS taking each DTensor's norms (solo's
    before) issues several per adapted shard. SimCLR's ResNet under FSDP: one collective in the optimizer step."""
    for rank in probed:
        toy, simclr = rank["toy"], rank["simclr"]
        assert toy["lars"] == [1, 1, 1], toy
        assert toy["lars_weight_error"] <= 1e-14 * toy["lars_moved"], toy
        assert toy["lars_per_parameter"] >= 2 * toy["adapted_sharded"] == 4, toy
        assert simclr["optimizer"] == 1 and simclr["adapted_sharded"] > 1, simclr


@pytest.mark.slow
@pytest.mark.processes
def test_fused_and_foreach_optimizers_step_shards_and_whole_parameters_of_one_group(probed):
    """solo's AdamW (fused) and SGD (foreach: DTensor has no fused SGD) on that model, each group holding shards and
    whole parameters: three float64 steps give those of the unsharded model (fused AdamW and fused SGD there), to
    1e-14 of how far the weights moved. torch's fused AdamW on such a group refuses to mix them."""
    for rank in probed:
        found = rank["optimizers"]
        assert found["adamw"]["kernels"] == [{"fused": True, "foreach": None}] * 2, found
        assert found["sgd"]["kernels"] == [{"fused": None, "foreach": True}, {"fused": True, "foreach": None}], found
        for name in ("adamw", "sgd"):
            assert found[name]["error"] <= 1e-14 * found[name]["moved"], found
        assert "got mixed torch.Tensor and DTensor" in found["torch_fused"], found


@pytest.mark.slow
@pytest.mark.processes
def test_ddp_reduces_what_gradcache_accumulates_past_its_wrapper_at_every_step(probed):
    """DDP as solo wraps the model (gradients as views of its buckets), three steps of a backward past the wrapper
    (GradCache's micro-batches) and one through it: the gradients are the mean over the ranks of each rank's sum,
    computed by hand (1e-15). With static_graph=True (the known-wrong variant) DDP counts the first window's hooks as
    its graph, and from the second step on leaves the gradients unreduced."""
    for rank in probed:
        ddp = rank["ddp"]
        assert max(ddp["solo"]) <= 1e-15, ddp
        assert ddp["static_graph"][0] <= 1e-15 and min(ddp["static_graph"][1:]) > 1e-3, ddp
