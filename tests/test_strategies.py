"""trainer.strategy: FSDP2 gives the step of one process on the whole batch, as DDP does, with ranks holding
uneven numbers of rows or none (tests/step_layouts.py); a LARS that takes its norms on the shards does not."""

import copy
import json
import shutil
import subprocess
import sys
import time

import pytest
import torch
from torch.distributed._composable import checkpoint

from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.methods import METHODS
from solo.train.distribute import blocks, checkpoint_blocks
from solo.train.state import OptimizerState
from solo.train.step import precision_context
from solo.train.trainer import build_model
from tests.test_accumulate import VIT
from tests.test_clip import TINY_CLIP
from tests.test_methods import method_overrides
from tests.test_train import (
    REPO,
    TINY,
    compose_cfg,
    forked,
    kill_processes_mentioning,
    launch,
    run,
    weights,
    weights_at_init,
)

STEPS = 3
SIMCLR = TINY + ["method=simclr", "trainer.precision=64"]  # LARS, BatchNorm in the backbone and the projector
# Every registered method as tests/test_methods.py trains it, with: for DINO, a gradient clip that binds; CLIP's two
# towers and logit scale in float64; DeepClusterV2 on 24 samples, so that its k-means (after the first epoch's 2 steps)
# gives step 3 a loss; W-MSE whitening the whole batch. Among them, ViTs whose patch embedding, tokens and blocks a masked-image method calls one by one
# (MAE's, I-JEPA's, DINOv2's student and its EMA teacher with multi-crop through the same units).
# solo's own methods: not those that other test modules register in this process (tests/toy_ema_method.py)
BUILT_IN = [name for name in METHODS.names() if METHODS[name].target.__module__.startswith("solo.")]
CASES = {method: method_overrides(method) for method in BUILT_IN} | {
    "simclr": SIMCLR,
    "dino": method_overrides("dino") + ["optim.grad_clip=0.3"],
    "clip": TINY_CLIP + ["trainer.precision=64"],
    "deepclusterv2": method_overrides("deepclusterv2") + ["data.num_samples=24"],
    "wmse": method_overrides("wmse") + ["method.whitening_size=12"],  # one sub-batch, the whole of the 12 rows
    # Regrouping (k-means reads the host) after step 2, so that step 3, which tests/test_host_reads.py counts, is a
    # plain step of moving groups and queue.
    "smog": method_overrides("smog") + ["method.regroup_every=2"],
}
# Stochastic depth in the ViT of MAE and DINOv2 (its student: the teacher has none); and the known-wrong variant,
# timm's DropPath drawing from torch's generator (tests/shared_generator_drop_path.py).
DROP_PATH = {m: method_overrides(m) + ["backbone.drop_path_rate=0.2"] for m in ("mae", "dinov2")}
SHARED_DROP_PATH = DROP_PATH["mae"] + [
    "imports=[tests.shared_generator_drop_path]",
    "backbone.name=test_vit_shared_drop_path",
]


# Every method runs FSDP with activation checkpointing on [0, 12] rows (rank 0, which logs and writes, holds none).
# One method of each kind (LARS and BatchNorm, an EMA teacher with a clip that binds, ViTs called unit by unit) also
# runs at W = 3 on [8, 0, 4] with checkpointing, and on [9, 3] without. (At W = 3 the 3 processes share this
# machine's 2 cores: a method's three steps there cost about twice those at W = 2, bench: 8 methods, 58 s and 31 s.)
FSDP_AT_THREE = ("simclr", "dino", "mae", "dinov2")
WRONG_LARS = ["imports=[tests.shard_norm_lars]", "optim.name=lars_shard_norms", "trainer.strategy=fsdp"]
VIT_ANY_SIZE = [o for o in SIMCLR if not o.startswith("backbone")] + VIT + ["+backbone.kwargs.dynamic_img_size=true"]
VIT_FP32 = [o for o in TINY if not o.startswith("backbone")] + VIT + ["method=simclr"]
VIT_FP64 = VIT_FP32 + ["trainer.precision=64"]


# CI's cases of the FSDP test (the others: `pytest -m exhaustive`): a method of each kind of parameters and state that
# FSDP's shards meet. Those at W = 3; two towers and a logit scale (CLIP), a locked one (LiT), a frozen pretrained
# teacher (distill); a trainable parameter inside the backbone left frozen (CrossMAE's last norm); an EMA teacher with a
# queue (MoCo v2+), prototypes frozen at first (SwAV), a memory bank and k-means (DeepClusterV2), buffers moved by the
# global batch (SMoG's groups), a target encoder with a predictor (I-JEPA) and a mask token (MaskFeat). Left to
# exhaustive for CI's budget, their kinds being those above: NNCLR's support set and DenseCL's dense queues (buffers as
# MoCo v2+'s queue), TiCo's running covariance (as SMoG's groups), W-MSE's whitening (a loss, no state) and VICReg's
# expander (plain layers, as SimCLR's projector).
FSDP_KINDS = FSDP_AT_THREE + tuple(
    "clip lit distill crossmae mocov2plus swav deepclusterv2 smog ijepa maskfeat".split()
)
assert set(FSDP_KINDS) <= set(CASES), set(FSDP_KINDS) - set(CASES)
FSDP_TEST = "test_fsdp_step_equals_one_process_with_uneven_and_empty_ranks"


def layout_jobs(methods) -> dict[str, tuple[list[str], list[int]]]:
    """Every stepped run the tests below compare, by name: (overrides, rows per rank); the FSDP test's for `methods`."""
    jobs = {}
    for method, overrides in CASES.items():
        if method not in methods:
            continue
        checkpointed = overrides + ["trainer.strategy=fsdp", "trainer.activation_checkpointing=true"]
        jobs[f"{method}/one"] = (overrides, [12])
        jobs[f"{method}/fsdp-0-12"] = (checkpointed, [0, 12])
        if method in FSDP_AT_THREE:
            jobs[f"{method}/fsdp-8-0-4"] = (checkpointed, [8, 0, 4])
            jobs[f"{method}/fsdp-9-3"] = (overrides + ["trainer.strategy=fsdp"], [9, 3])
    jobs["simclr/lars-on-shards"] = (SIMCLR + WRONG_LARS, [9, 3])
    jobs["clip/ddp-8-0-4"] = (CASES["clip"], [8, 0, 4])
    jobs["clip/ddp-9-3"] = (CASES["clip"], [9, 3])
    for method, overrides in DROP_PATH.items():
        jobs[f"{method}-drop-path/one"] = (overrides, [16])
        jobs[f"{method}-drop-path/none"] = (method_overrides(method), [16])
        jobs[f"{method}-drop-path/ddp-8-8"] = (overrides, [8, 8])
        jobs[f"{method}-drop-path/accumulate"] = (overrides + ["trainer.accumulate=2"], [8, 8])
        checkpointed = ["trainer.strategy=fsdp", "trainer.activation_checkpointing=true"]
        jobs[f"{method}-drop-path/fsdp-checkpointed-12-4"] = (overrides + checkpointed, [12, 4])
    jobs["shared-drop-path/one"] = (SHARED_DROP_PATH, [16])
    jobs["shared-drop-path/ddp-8-8"] = (SHARED_DROP_PATH, [8, 8])
    jobs["vit-any-size/one"] = (VIT_ANY_SIZE, [12])
    jobs["vit-any-size/ddp-8-0-4"] = (VIT_ANY_SIZE, [8, 0, 4])
    jobs["vit-any-size/fsdp-8-0-4"] = (VIT_ANY_SIZE + ["trainer.strategy=fsdp"], [8, 0, 4])
    jobs["vit/one"] = (VIT_FP64, [12])
    jobs["vit/fsdp-accumulate"] = (VIT_FP64 + ["trainer.strategy=fsdp", "trainer.accumulate=2"], [6, 6])
    jobs["vit-fp32/one"] = (VIT_FP32, [12])
    jobs["vit-fp32/fsdp-bf16"] = (VIT_FP32 + ["trainer.strategy=fsdp", "trainer.precision=bf16"], [6, 6])
    return jobs


@pytest.fixture(scope="module")
def stepped(request, tmp_path_factory):
    """name -> the whole weights after STEPS steps of that job (tests/step_layouts.py), with the global batch split
    over the ranks as its layout says: the jobs of each world size in one launch, the 3 launches at once (a rank with
    no rows leaves its core mostly idle, which the other launches take: 197 s against 282 s one after another, 49
    methods on 2 cores)."""
    root = tmp_path_factory.mktemp("layouts")
    methods = {item.callspec.params["method"] for item in request.session.items if item.originalname == FSDP_TEST}
    jobs, files, launches = layout_jobs(methods | {"clip"}), {}, {}  # CLIP's one-process run: its DDP test's too
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PATH": ""}
    for world in sorted({len(layout) for _, layout in jobs.values()}):
        mine = {
            name: root / f"{name.replace('/', '_')}.pt" for name, (_, layout) in jobs.items() if len(layout) == world
        }
        files |= mine
        (root / f"jobs-{world}.json").write_text(json.dumps([[str(mine[n]), jobs[n][1], jobs[n][0]] for n in mine]))
        script = [str(REPO / "tests" / "step_layouts.py"), str(root / f"jobs-{world}.json"), str(STEPS)]
        launcher = forked(world)
        log = root / f"launch-{world}.log"
        with log.open("w") as out:
            launches[log] = subprocess.Popen([*launcher, *script], cwd=REPO, env=env, stdout=out, stderr=out)
    try:
        for log, process in launches.items():
            assert process.wait(timeout=900) == 0, log.read_text()[-6000:]
    finally:
        for process in launches.values():
            process.terminate()  # the launcher passes it on to its ranks; nothing for a launch that has ended
    return {
        name: {k: v for k, v in torch.load(f, weights_only=True).items() if v.is_floating_point()}
        for name, f in files.items()
    }


def worst_difference(a: dict, b: dict) -> tuple[float, str]:
    assert a.keys() == b.keys()
    return max((float((a[k] - b[k]).abs().max()), k) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", [m if m in FSDP_KINDS else pytest.param(m, marks=pytest.mark.exhaustive) for m in sorted(CASES)]
)
def test_fsdp_step_equals_one_process_with_uneven_and_empty_ranks(method, stepped):
    """3 float64 steps on 12 rows: FSDP with activation checkpointing at W = 2 on [0, 12] and, for FSDP_AT_THREE, at
    W = 3 on [8, 0, 4] and without checkpointing on [9, 3] == 1 process, to 1e-10 of how far the weights moved; a LARS
    on shard norms is not."""
    one = stepped[f"{method}/one"]
    start = weights_at_init(CASES[method] + ["data.batch_size=12"])
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    for layout in ("fsdp-0-12", "fsdp-8-0-4", "fsdp-9-3") if method in FSDP_AT_THREE else ("fsdp-0-12",):
        worst, name = worst_difference(one, stepped[f"{method}/{layout}"])
        assert worst <= 1e-10 * moved, f"{method}, {layout}: {name} differs by {worst} (moved {moved})"
    if method == "simclr":  # the pitfall: LARS's trust ratio from each rank's shard (tests/shard_norm_lars.py)
        worst, name = worst_difference(one, stepped["simclr/lars-on-shards"])
        assert worst > 1e-6 * moved, f"LARS on shard norms gave the whole-tensor step ({name}: {worst})"


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(DROP_PATH))
def test_stochastic_depth_draws_per_sample_at_any_world_size_and_micro_batching(method, stepped):
    """backbone.drop_path_rate=0.2, 3 float64 steps of 16 rows: 2 processes of 8 rows, the same with
    trainer.accumulate=2, and FSDP with activation checkpointing on [12, 4] rows (the blocks run again in the backward)
    == 1 process, to 1e-10 of how far the weights moved. The masks matter: without stochastic depth the step differs.
    timm's DropPath, drawing from torch's generator row after row, does not give 1 process's step."""
    one = stepped[f"{method}-drop-path/one"]
    start = weights_at_init(DROP_PATH[method] + ["data.batch_size=16"])
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    for layout in ("ddp-8-8", "accumulate", "fsdp-checkpointed-12-4"):
        worst, name = worst_difference(one, stepped[f"{method}-drop-path/{layout}"])
        assert worst <= 1e-10 * moved, f"{method}, {layout}: {name} differs by {worst} (moved {moved})"
    worst, name = worst_difference(one, stepped[f"{method}-drop-path/none"])
    assert worst > 1e-3 * moved, f"{method}: stochastic depth left the step as it was ({name}: {worst})"
    if method == "mae":
        worst, name = worst_difference(stepped["shared-drop-path/one"], stepped["shared-drop-path/ddp-8-8"])
        assert worst > 1e-3 * moved, f"timm's DropPath gave 1 process's step at W = 2 ({name}: {worst})"


@pytest.mark.slow
def test_clip_ddp_step_equals_one_process_with_uneven_and_empty_ranks(stepped):
    """The whole of CLIP (image tower, text tower, logit scale) under DDP at W = 3 ([8, 0, 4]) and W = 2 ([9, 3]) ==
    1 process, to 1e-10 of how far the weights moved; the logit scale and the text tower move."""
    one = stepped["clip/one"]
    start = weights_at_init(CASES["clip"] + ["data.batch_size=12"])
    moved = {k: float((one[k] - start[k]).abs().max()) for k in start}
    assert moved["method.log_logit_scale"] > 0 and moved["method.text_tower.token_embedding.weight"] > 0
    for layout in ("ddp-8-0-4", "ddp-9-3"):
        worst, name = worst_difference(one, stepped[f"clip/{layout}"])
        assert worst <= 1e-10 * max(moved.values()), f"CLIP, {layout}: {name} differs by {worst}"


@pytest.mark.slow
def test_a_vit_of_any_input_size_takes_a_rank_with_no_rows(stepped):
    """SimCLR through the ViT's own forward with `dynamic_img_size`, on which timm's fails for an empty batch: DDP and
    FSDP at W = 3 ([8, 0, 4]) equal one process, to 1e-10 of how far the weights moved. Under FSDP the empty rank's
    backward reaches the ViT's whole parameters (class token, position embeddings) in another order: their
    gradients, averaged as each arrived, paired mismatched collectives across the ranks (gloo: "Received data size
    doesn't match expected size"); they are averaged after the backward, in one order."""
    one = stepped["vit-any-size/one"]
    start = weights_at_init(VIT_ANY_SIZE + ["data.batch_size=12"])
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    for layout in ("ddp-8-0-4", "fsdp-8-0-4"):
        worst, name = worst_difference(one, stepped[f"vit-any-size/{layout}"])
        assert worst <= 1e-10 * moved, f"{layout}: {name} differs by {worst} (moved {moved})"


@pytest.mark.slow
def test_fsdp_accumulation_and_bf16_on_a_vit(stepped):
    """A ViT (its blocks the units, LayerNorm): FSDP at W = 2 with trainer.accumulate=2 equals one process (float64,
    1e-10); FSDP in bf16 (the blocks gathered and computed in bf16, float32 weights) stays near the float32 step."""
    one = stepped["vit/one"]
    start = weights_at_init(VIT_FP64 + ["data.batch_size=12"])
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    worst, name = worst_difference(one, stepped["vit/fsdp-accumulate"])
    assert worst <= 1e-10 * moved, f"FSDP with accumulation: {name} differs by {worst} (moved {moved})"

    fp32, bf16 = stepped["vit-fp32/one"], stepped["vit-fp32/fsdp-bf16"]
    assert all(v.dtype == torch.float32 for v in bf16.values())
    # The parameters. BatchNorm's running statistics average the bf16-rounded activations themselves: 0.063 of the
    # movement (the projector's running mean) on a CPU with native bf16 (avx512_bf16) and 0.108 on other draws of the
    # synthetic images (torch's generator since 2026-11-28).
    learned = [k for k in fp32 if "running_" not in k]
    worst, name = worst_difference({k: fp32[k] for k in learned}, {k: bf16[k] for k in learned})
    # Native bf16 rounds every product: 0.043 of the movement there (a ViT block's bias); 0.05 bounded it on CPUs that
    # emulate bf16. A wrong step differs by about the movement itself.
    assert 0 < worst <= 0.1 * moved, f"bf16: {name} differs by {worst} (moved {moved})"


def killed_after(overrides: list[str], run_dir, step: int, nproc: int) -> None:
    """Launch a run and kill all its processes once its checkpoint of `step` is written."""
    proc = launch(overrides, run_dir, nproc=nproc, torchrun=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (run_dir / "checkpoints" / f"step-{step:09d}").exists() and time.time() < deadline:
        assert proc.poll() is None, "the run ended before the kill"
        time.sleep(0.05)
    kill_processes_mentioning(str(run_dir))
    proc.wait()


@pytest.mark.slow
def test_killed_under_fsdp_at_w2_resumes_under_ddp_at_w3_as_if_never_stopped(tmp_path):
    """DINO (teacher, centre, multi-crop), float64, global batch 12: FSDP at W = 2 killed after step 3 and resumed by
    DDP at W = 3 ends with the weights of one uninterrupted process (1e-10); resumed by FSDP at W = 2, bit-identical to
    the uninterrupted FSDP W = 2 run."""
    common = CASES["dino"] + ["trainer.max_steps=6", "trainer.checkpoint_every_steps=1", "trainer.keep_checkpoints=10"]
    fsdp = common + ["trainer.strategy=fsdp", "data.batch_size=6"]
    run(common + ["data.batch_size=12"], tmp_path / "one")
    run(fsdp, tmp_path / "fsdp", nproc=2)
    killed_after(fsdp, tmp_path / "killed", 3, nproc=2)
    shutil.copytree(tmp_path / "killed", tmp_path / "killed_again")
    checkpoint = read_checkpoint(tmp_path / "killed" / "checkpoints" / "last")
    assert 3 <= checkpoint["step"] < 6, "the kill lands mid-run"

    assert "resuming from" in run(common + ["trainer.strategy=ddp", "data.batch_size=4"], tmp_path / "killed", nproc=3)
    one, start = weights(tmp_path / "one"), weights_at_init(common + ["data.batch_size=12"])
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    worst, name = worst_difference(one, weights(tmp_path / "killed"))
    assert worst <= 1e-10 * moved, f"{name} differs by {worst} (moved {moved})"

    assert "resuming from" in run(fsdp, tmp_path / "killed_again", nproc=2)
    uninterrupted, resumed = weights(tmp_path / "fsdp"), weights(tmp_path / "killed_again")
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)


def _one_step(model, batch: dict) -> tuple[dict, dict]:
    out = model(batch)
    (out["loss"] + out["probe_loss"]).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, dict(model.named_buffers())


def test_activation_checkpointing_gives_the_same_step_and_leaves_batchnorm_as_one_forward():
    """float64: per-block checkpointing gives the gradients and BatchNorm statistics of the plain model exactly;
    torch's checkpoint alone (the known-wrong variant) runs each block's BatchNorms twice, updating their statistics
    twice."""
    cfg = compose_cfg(SIMCLR + ["data.batch_size=8"])
    torch.manual_seed(0)
    plain = build_model(cfg, 10).double()
    ours, naive = copy.deepcopy(plain), copy.deepcopy(plain)
    checkpoint_blocks(ours)
    for block in blocks(naive):
        checkpoint(block)
    assert len(blocks(plain)) == 4  # the ResNet's stages
    g = torch.Generator().manual_seed(1)
    batch = {"views": [torch.randn(8, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]}
    batch["label"] = torch.randint(0, 10, (8,), generator=g)
    want_grads, want_buffers = _one_step(plain, batch)
    grads, buffers = _one_step(ours, batch)
    assert grads.keys() == want_grads.keys() and buffers.keys() == want_buffers.keys()
    assert all(torch.equal(grads[k], want_grads[k]) for k in grads)
    assert all(torch.equal(buffers[k], want_buffers[k]) for k in buffers)
    _, naive_buffers = _one_step(naive, batch)
    stats = [k for k in buffers if k.endswith("running_mean") and ".layer" in k]
    assert stats and not all(torch.equal(naive_buffers[k], want_buffers[k]) for k in stats)


@pytest.mark.slow  # a run that tries inductor first: about 14 s
@pytest.mark.one_process
def test_compile_falls_back_to_eager_with_one_warning_where_it_cannot_compile(tmp_path):
    """No C++ compiler for inductor (CXX names none, an empty cache): the run trains uncompiled and says why, once."""
    env = {"CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    overrides = SIMCLR + ["trainer.max_steps=1", "data.batch_size=8", "trainer.compile=blocks"]
    proc = launch(overrides, tmp_path / "run", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert out.count("trainer.compile=blocks: torch.compile does not work here (") == 1, out
    assert "No working C++ compiler" in out and "training runs uncompiled" in out


@pytest.mark.slow  # compiling takes half a minute on a CPU (a ResNet's four stages: a minute)
@pytest.mark.one_process
def test_compiled_blocks_or_backbone_give_the_eager_step_within_float32_rounding(tmp_path):
    # A ViT (two blocks), float32 (what compile is for), compiled block by block and whole.
    common = [o for o in TINY if not o.startswith("backbone")] + VIT + ["method=simclr"]
    common += ["trainer.max_steps=3", "data.batch_size=16"]
    run(common, tmp_path / "eager")
    eager, start = weights(tmp_path / "eager"), weights_at_init(common)
    moved = max(float((eager[k] - start[k]).abs().max()) for k in start)
    for scope in ("blocks", "backbone"):
        out = run(common + [f"trainer.compile={scope}"], tmp_path / scope)
        assert "does not work here" not in out, out  # compiled, not the eager fallback
        worst, name = worst_difference(eager, weights(tmp_path / scope))
        assert worst <= 1e-3 * moved, f"compile={scope}: {name} differs by {worst} (moved {moved})"


def test_float16_on_the_cpu_is_refused_with_what_to_use():
    with pytest.raises(ConfigError, match="trainer.precision=16 needs a GPU; on the CPU use trainer.precision=bf16"):
        precision_context("16", torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.one_process
def test_gpu_script_says_it_needs_a_gpu_where_there_is_none():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bench/gpu.sh runs for real")
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "bench/gpu.sh needs a GPU: torch sees none" in proc.stderr


def _stepped(optimizer_cls, frozen: str | None = None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = optimizer_cls(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    if frozen:  # a parameter the step leaves alone, as a group in its frozen_steps
        model.get_parameter(frozen).grad = None
    optimizer.step()
    return model, optimizer


def test_optimizer_state_is_saved_by_name_and_loads_old_position_keyed_checkpoints():
    """A checkpoint's optimizer state is keyed by parameter name (what lets it load under another strategy), a state
    of solo 0.2 (keyed by position) still loads, and a parameter with no state saved has none after loading (torch's
    loader would leave AdamW a step count from its initialising step)."""
    model, optimizer = _stepped(torch.optim.AdamW, frozen="1.bias")
    saved = OptimizerState(model, optimizer).state_dict()
    assert set(saved["state"]) == {"0.weight", "0.bias", "1.weight"}
    for state, load in ((saved, "load_state_dict"), (optimizer.state_dict(), "load_whole")):  # as solo 0.2 wrote it
        fresh_model, fresh = _stepped(torch.optim.AdamW)
        fresh.state.clear()  # a model and optimizer as the trainer builds them: no state, no gradients
        fresh.zero_grad(set_to_none=True)
        fresh_model.load_state_dict(model.state_dict())
        getattr(OptimizerState(fresh_model, fresh), load)(copy.deepcopy(state))
        for (name, p), q in zip(model.named_parameters(), fresh_model.parameters()):
            assert optimizer.state[p].keys() == fresh.state[q].keys(), name
            assert all(torch.equal(optimizer.state[p][k], fresh.state[q][k]) for k in optimizer.state[p]), name


DDP_GRADIENT_STRIDES = """
import json, sys, warnings
import torch, torch.distributed as dist, torch.nn as nn
import solo.train.distribute  # noqa: F401  (its warning filter)


class ChannelsLastGradient(torch.autograd.Function):  # as a 1x1 convolution of channels_last inputs gives its weight
    forward = staticmethod(lambda ctx, w: w.clone())
    backward = staticmethod(lambda ctx, g: torch.empty_strided(g.shape, (g.shape[1], 1, g.shape[1], g.shape[1])).copy_(g))


class OneByOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, 1, 1))

    def forward(self):
        return (ChannelsLastGradient.apply(self.weight) ** 2).sum()


def warned(case, filters):
    if case == "1x1":  # strides that differ from the bucket's in the size-1 dimensions only: the same memory
        model = nn.parallel.DistributedDataParallel(OneByOne(), gradient_as_bucket_view=True)
        loss = model
    else:  # a 3x3 weight made channels_last after DDP laid out its buckets: its gradient's memory is not the bucket's
        model = nn.parallel.DistributedDataParallel(nn.Conv2d(4, 6, 3), gradient_as_bucket_view=True)
        model.module.weight.data = model.module.weight.data.contiguous(memory_format=torch.channels_last)
        loss = lambda: model(torch.randn(2, 4, 8, 8)).sum()
    with warnings.catch_warnings(record=True) as caught:
        if filters == "none":
            warnings.resetwarnings()
        warnings.filterwarnings("always", append=True)
        loss().backward()
    return any("Grad strides do not match bucket view strides" in str(w.message) for w in caught)


torch.set_warn_always(True)  # torch warns for a process's first mismatched gradient only: here for each
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
cases = [("1x1", "solo's"), ("1x1", "none"), ("3x3", "solo's")]
print(json.dumps({" ".join(case): warned(*case) for case in cases}))
"""


@pytest.mark.slow  # a process of its own: about 10 s
def test_ddp_stride_warning_hidden_for_1x1_weights_only(tmp_path):
    """A 1x1 convolution's weight gradient whose strides differ from DDP's bucket only in its size-1 dimensions (the
    same memory; channels_last inputs give it): solo hides DDP's warning, which shows without solo's filter. A 3x3
    weight made channels_last after DDP laid out its buckets, whose gradient's memory is laid out otherwise, still
    warns."""
    out = subprocess.run(
        [sys.executable, "-c", DDP_GRADIENT_STRIDES, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown == {"1x1 solo's": False, "1x1 none": True, "3x3 solo's": True}, shown
