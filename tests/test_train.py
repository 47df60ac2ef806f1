"""The pretraining job end to end: world-size invariance, exact resume, learning, and clear errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from solo.config import register_configs, validate_pretrain
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import CheckpointError, TrainingDiverged
from solo.train.trainer import pretrain

REPO = Path(__file__).resolve().parents[1]
register_configs()

# A small model with BatchNorm everywhere (backbone and projector), on small synthetic images.
TINY = [
    "data=synthetic",
    "data.image_size=16",
    "data.num_samples=64",
    "data.num_workers=0",
    "backbone=resnet18",  # the group named, so no method's digits recipe picks its own (resnet18_half: its channels)
    "backbone.name=test_resnet",
    "method.proj_hidden_dim=32",
    "method.proj_output_dim=16",
    "optim.warmup_epochs=0",
    "trainer.progress_bar=false",
    "trainer.log_every_steps=1",
    "trainer.plots=false",  # t-SNE at every test run's end costs time; test_eval checks the pictures
]
# TINY for another dataset (data=...): without the synthetic dataset's own keys.
TINY_FILES = [o for o in TINY if not o.startswith("data.num_samples")]


def compose_cfg(overrides):
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        return validate_pretrain(compose("pretrain", overrides=overrides))  # as main_pretrain.py does


def forked(nproc: int) -> list[str]:
    """The launcher of `nproc` ranks forked from one process that has imported the training's modules
    (tests/forked_launch.py): for the launches whose subject is the training, not torchrun, each of whose ranks
    would import them itself (about 7 s of CPU each here, and 3 s for torchrun's agent)."""
    return [sys.executable, str(REPO / "tests" / "forked_launch.py"), str(nproc)]


def launch(overrides, run_dir, nproc=1, env=None, torchrun=True, **popen):
    """main_pretrain.py in a process of its own, or in `nproc` under torchrun (else the forked launcher)."""
    cmd = [sys.executable, "main_pretrain.py"]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
        cmd = [*(launcher if torchrun else forked(nproc)), "main_pretrain.py"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(cmd + overrides + [f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, **popen)


def run(overrides, run_dir, nproc=1, timeout=300):
    """A run to its end (its ranks forked: tests/forked_launch.py); its output."""
    proc = launch(
        overrides, run_dir, nproc, torchrun=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def many_runs(runs: dict, nproc: int = 2) -> subprocess.CompletedProcess:
    """Pretraining runs {run_dir: overrides} one after another in one launch (tests/many_runs.py, its ranks forked),
    which pays the processes' start (about 7 s of imports here) once, not once per run; the launch, with its output."""
    root = next(iter(runs)).parent
    root.mkdir(parents=True, exist_ok=True)
    (root / "runs.json").write_text(json.dumps([[str(d), o] for d, o in runs.items()]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [*forked(nproc), str(REPO / "tests" / "many_runs.py"), str(root / "runs.json")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60 * len(runs) + 60,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def kill_processes_mentioning(marker: str) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if marker in cmdline:
                os.kill(int(pid), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass


def weights(run_dir) -> dict:
    state = read_checkpoint(Path(run_dir) / "checkpoints" / "last")
    return {k: v for k, v in state["model"].items() if v.is_floating_point()}


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


INVARIANCE_TEST = "test_world_size_invariance"


def invariance_overrides(method: str, augment_on: str, precision: str) -> list[str]:
    return TINY + [
        f"method={method}",
        "trainer.max_steps=3",
        f"trainer.precision={precision}",
        f"data.augment_on={augment_on}",
    ]


@pytest.fixture(scope="module")
def invariance_runs(request, tmp_path_factory):
    """(method, augment_on, precision) -> the run dirs of its 1 x 16 and 2 x 8 runs, for the selected cases: the
    1-process runs in this process, the 2-process ones in one launch."""
    selected = sorted(
        {
            (item.callspec.params["method"], item.callspec.params["augment_on"], item.callspec.params["precision"])
            for item in request.session.items
            if item.originalname == INVARIANCE_TEST
        }
    )
    root = tmp_path_factory.mktemp("invariance")
    runs = {case: (root / "-".join(case) / "w1", root / "-".join(case) / "w2") for case in selected}
    for case, (one, _) in runs.items():
        pretrain(compose_cfg(invariance_overrides(*case) + ["data.batch_size=16"]), one)
    many_runs({two: invariance_overrides(*case) + ["data.batch_size=8"] for case, (_, two) in runs.items()})
    return runs


@pytest.mark.parametrize("precision, tolerance", [("64", 1e-10), pytest.param("32", 3e-4, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "method, augment_on",
    [
        ("simclr", "cpu"),
        pytest.param("simclr", "device", marks=pytest.mark.slow),
        pytest.param("barlow_twins", "cpu", marks=pytest.mark.slow),
    ],
)
@pytest.mark.processes
def test_world_size_invariance(invariance_runs, method, augment_on, precision, tolerance):
    """1 process with batch 16 and 2 processes with batch 8 end with the same weights (SyncBatchNorm on), with
    the views made in the DataLoader workers or on the training device (here the CPU: the same batched code).

    In float64 the two agree to rounding (~1e-13): the step is exact. In float32 the rounding noise
    of one step is ~3e-6 of the largest gradient; after 3 LARS steps the weights differ by about 1e-4 of
    how far training moved them (Barlow Twins: 1.4e-4 when this process runs torch on 2 threads, as with
    pytest -n0; a wrong step differs by about the movement itself).
    """
    w1, w2 = invariance_runs[(method, augment_on, precision)]
    one, two = weights(w1), weights(w2)
    start = weights_at_init(invariance_overrides(method, augment_on, precision))
    assert one.keys() == two.keys() == start.keys()
    moved = max(float((one[k].double() - start[k].double()).abs().max()) for k in one)
    worst, name = max((float((one[k] - two[k]).abs().max()), k) for k in one)
    assert worst <= tolerance * moved, f"{name}: W=1 and W=2 differ by {worst}, training moved weights by up to {moved}"
    # The logged losses are the global-batch losses too, and the health metrics are the whole val split's
    # (solo.eval.health; tests/test_health.py shows one shard's differ).
    health = ("val/rankme", "val/embedding_rankme", "val/embedding_std", "val/uniformity")
    assert any(health[0] in a for a in metrics(w1)) and any("train/alignment" in a for a in metrics(w1))
    assert any("train/lidar" in a for a in metrics(w1))
    for a, b in zip(metrics(w1), metrics(w2)):
        for key in ("train/loss", "train/alignment", "train/lidar", *health):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=tolerance), key


@pytest.mark.slow  # 17 s of training: the quick suite keeps under 4 min
@pytest.mark.one_process
def test_views_made_on_the_device_train_as_those_made_in_the_workers(tmp_path):
    """data.augment_on=device makes each batch's views at once from the parameters the workers drew; the CPU path
    makes them sample by sample in the workers. Same views, so the same weights (float64, 1e-10 of their movement);
    every augmentation operation is on (tests/test_augment.py checks each against torchvision)."""
    views = (
        "augmentation.views=[{crop_scale:[0.3,1.0],hflip_prob:0.5,blur_prob:0.5,solarize_prob:0.3,grayscale_prob:0.3}]"
    )
    common = TINY + [
        "trainer.max_steps=3",
        "trainer.precision=64",
        "data.batch_size=16",
        "data.num_workers=1",
        views.replace("}]", "},{crop_scale:[0.3,1.0],hue:0.1,blur_prob:0.5}]"),
    ]
    run(common + ["data.augment_on=cpu"], tmp_path / "cpu")
    run(common + ["data.augment_on=device"], tmp_path / "device")
    cpu, device, start = weights(tmp_path / "cpu"), weights(tmp_path / "device"), weights_at_init(common)
    moved = max(float((cpu[k] - start[k]).abs().max()) for k in cpu)
    worst, name = max((float((cpu[k] - device[k]).abs().max()), k) for k in cpu)
    assert worst <= 1e-10 * moved, f"{name}: the two paths differ by {worst}, training moved weights by up to {moved}"


def weights_at_init(overrides) -> dict:
    from solo.train.trainer import build_model

    cfg = compose_cfg(overrides)
    torch.manual_seed(cfg.trainer.seed)
    return {k: v for k, v in build_model(cfg, 10).state_dict().items() if v.is_floating_point()}


@pytest.mark.slow  # kills and restarts a 2-process run: about a minute
def test_resume_after_kill_is_bit_identical(tmp_path):
    """Kill a 2-process run right after a mid-epoch checkpoint, restart it: same final weights as uninterrupted.
    Its views are made on the device, whose random state the checkpoint must carry as well; the kills of runs
    whose views are made in the workers: shards, Hugging Face datasets, FSDP to DDP (tests/test_strategies.py)."""
    common = TINY + [
        "data.num_samples=128",
        "data.batch_size=8",
        "trainer.max_steps=24",
        "trainer.checkpoint_every_steps=3",
        "data.augment_on=device",
    ]
    run(common, tmp_path / "straight", nproc=2)

    killed = tmp_path / "killed"
    proc = launch(common, killed, nproc=2, torchrun=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = killed / "checkpoints" / "step-000000003"
    deadline = time.time() + 120
    while not first.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    kill_processes_mentioning(str(killed))  # torchrun and its workers, at once, as a node failure would
    proc.wait()
    state = read_checkpoint(killed / "checkpoints" / "last")
    assert 0 < state["step"] < 24 and state["data"]["batch_in_epoch"] != 0, (
        "the kill must land mid-run, after a mid-epoch checkpoint"
    )

    out = run(common, killed, nproc=2)
    assert f"resuming from {killed / 'checkpoints' / 'last'} at step {state['step']}" in out
    straight, resumed = weights(tmp_path / "straight"), weights(killed)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    steps = [m["step"] for m in metrics(killed) if "train/loss" in m]
    assert steps == sorted(set(steps)) == list(range(1, 25)), "metrics.jsonl has each step exactly once"


def test_a_checkpoint_file_of_solo_0_2_resumes_bit_identical(tmp_path):
    """solo 0.2 wrote one .pt file per checkpoint (whole tensors, small state alongside); such a run directory still
    resumes. The file is made from step 3's DCP checkpoint of an uninterrupted run by torch's own converter
    (dcp_to_torch_save); resumed from it alone, the run ends bit-identical to the uninterrupted one."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    common = TINY + ["data.batch_size=16", "trainer.max_steps=6", "trainer.checkpoint_every_steps=3"]
    pretrain(compose_cfg(common + ["trainer.keep_checkpoints=10"]), tmp_path / "straight")
    step3 = tmp_path / "straight" / "checkpoints" / "step-000000003"
    dcp_to_torch_save(step3, tmp_path / "tensors.pt")
    old = torch.load(step3 / "trainer.pt", weights_only=True) | torch.load(tmp_path / "tensors.pt", weights_only=True)
    assert {"model", "optimizer", "step", "data", "config"} <= old.keys()  # as solo 0.2 wrote it: one file
    checkpoints = tmp_path / "old" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(old, checkpoints / "step-000000003.pt")
    os.link(checkpoints / "step-000000003.pt", checkpoints / "last.pt")

    pretrain(compose_cfg(common), tmp_path / "old")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last", "step-000000004", "step-000000006"]  # 0.2's pruned
    straight, resumed = weights(tmp_path / "straight"), weights(tmp_path / "old")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.slow
@pytest.mark.one_process
def test_default_run_learns(tmp_path):
    """A smoke run of the default, one epoch: the online probe beats chance by far, and the outputs are all there.
    (How far the default learns is a measurement: the zoo's simclr entry, `python scripts/build_zoo.py --check`.)"""
    cfg = compose_cfg(["trainer.max_epochs=1", "data.batch_size=64", "trainer.progress_bar=false"])
    final = pretrain(cfg, tmp_path)
    assert final["val/acc1"] >= 0.3  # chance is 0.1; 0.536 on 2026-12-04 (2 epochs read 0.5 or more, at twice the time)
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "checkpoints" / "last").exists()
    rows = metrics(tmp_path)
    train_rows = [r for r in rows if "train/loss" in r]
    assert train_rows and all({"step", "epoch", "train/loss", "lr", "train/img_per_s"} <= r.keys() for r in train_rows)
    assert [r["epoch"] for r in rows if "val/acc1" in r] == [0]


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    # The lr warms up from 0 towards 1e30: the first steps are harmless, a later one diverges.
    overrides = TINY + [
        "trainer.max_steps=8",
        "data.batch_size=16",
        "optim.lr=1e30",
        "optim.warmup_epochs=2",
        "trainer.checkpoint_every_steps=1",
        "trainer.keep_checkpoints=10",
    ]
    with pytest.raises(TrainingDiverged, match="last good state"):
        pretrain(compose_cfg(overrides), tmp_path)
    state = read_checkpoint(tmp_path / "checkpoints" / "last")
    logged = [m["step"] for m in metrics(tmp_path) if "train/loss" in m]
    assert 1 <= state["step"] == logged[-1] < 8, "the last checkpoint is that of the last step that trained"
    assert all(torch.isfinite(v).all() for v in weights(tmp_path).values())


def test_global_batch_larger_than_dataset(tmp_path):
    with pytest.raises(
        ValueError, match=r"global batch \(128 per process x 1 processes = 128\) is larger than the dataset \(64"
    ):
        pretrain(compose_cfg(TINY + ["data.batch_size=128"]), tmp_path)


def test_unknown_backbone_suggests_names(tmp_path):
    with pytest.raises(ValueError, match="did you mean: resnet18"):
        pretrain(compose_cfg(TINY + ["backbone.name=resnet181"]), tmp_path)


def test_missing_data_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        pretrain(compose_cfg(TINY_FILES + ["data=imagefolder", f"data.root={missing}"]), tmp_path / "run")


def test_corrupt_image_is_named(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "data" / "train" / cls).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (20, 20), (i * 20, 0, 0)).save(tmp_path / "data" / "train" / cls / f"{i}.png")
    bad = tmp_path / "data" / "train" / "b" / "broken.png"
    bad.write_bytes(b"not a png at all")
    overrides = TINY_FILES + [
        "data=imagefolder",
        f"data.root={tmp_path / 'data'}",
        "data.image_size=16",
        "data.batch_size=17",
    ]
    with pytest.raises(Exception, match="broken.png"):
        pretrain(compose_cfg(overrides + ["trainer.max_steps=1"]), tmp_path / "run")


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.max_epoch=3", "Key 'max_epoch' not in 'TrainerConfig'"),
        ("trainer.max_epochs=many", "could not be converted to Integer"),
        ("method=simclrr", "Available options in 'method'"),
        ("method.lambd=0.1", "Key 'lambd' not in 'SimCLRConfig'"),
    ],
)
def test_config_errors_name_the_key(override, message):
    with pytest.raises(Exception) as err:
        compose_cfg([override])
    assert message in str(err.value) + str(err.value.__cause__)


@pytest.mark.slow
@pytest.mark.one_process
def test_wandb_offline_keeps_the_run_id_across_resume(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials: offline mode
    monkeypatch.setenv("WANDB_SILENT", "true")
    base = TINY + ["logger=wandb", "data.batch_size=16"]
    run_dir = tmp_path / "run"
    pretrain(compose_cfg(base + ["trainer.max_steps=2"]), run_dir)
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    pretrain(compose_cfg(base + ["trainer.max_steps=4"]), run_dir)
    sessions = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(sessions) == 2, list((run_dir / "wandb").iterdir())


def test_unlabeled_imagefolder_trains_without_probe(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    for i in range(16):
        Image.new("RGB", (20, 20), (i * 15, 255 - i * 15, 0)).save(tmp_path / "data" / "train" / f"{i}.png")
    overrides = TINY_FILES + [
        "data=imagefolder",
        f"data.root={tmp_path / 'data'}",
        "data.image_size=16",
        "data.batch_size=8",
    ]
    final = pretrain(compose_cfg(overrides + ["trainer.max_steps=2"]), tmp_path / "run")
    rows = metrics(tmp_path / "run")
    assert "train/loss" in final and not any("val/acc1" in r or "train/probe_loss" in r for r in rows)


def test_bf16_autocast_with_gradient_clipping_on_cpu(tmp_path):
    final = pretrain(
        compose_cfg(
            TINY + ["trainer.precision=bf16", "optim.grad_clip=1.0", "trainer.max_steps=2", "data.batch_size=16"]
        ),
        tmp_path,
    )
    assert torch.isfinite(torch.tensor(final["val/acc1"])) and all(
        torch.isfinite(v).all() for v in weights(tmp_path).values()
    )


@pytest.mark.slow  # a 2-process launch of 12 steps (18 s): the quick suite keeps under 4 min
def test_steady_state_steps_read_nothing_on_the_host(tmp_path):
    """On a GPU every read of a tensor's value on the host stalls the queue of kernels. Recorded in 2 processes
    (tests/host_reads_probe.py): the training step reads nothing after its first call (which exchanges the ranks'
    batch sizes, once per shape), the loop's per-step work reads nothing, and the preemption flag is read only
    at the logging steps."""
    log = tmp_path / "reads"
    overrides = TINY + [
        "data.num_samples=96",
        "data.batch_size=8",
        "trainer.max_steps=12",
        "trainer.log_every_steps=4",
        "imports=[tests.host_reads_probe]",
    ]
    proc = launch(
        overrides,
        tmp_path / "run",
        nproc=2,
        torchrun=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"HOST_READS_LOG": str(log)},
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    for rank in (0, 1):
        events = json.loads(Path(f"{log}.{rank}").read_text())
        in_steps = [e for e in events if e["region"] == "step"]
        assert in_steps and {e["step"] for e in in_steps} == {0}, in_steps  # the first step's size exchange only
        assert not [e for e in events if e["region"] == "loop"]
        assert [e["step"] for e in events if e["region"] == "preemption_check"] == [4, 8]  # step 12 is the last


def test_grad_clip_bounds_the_methods_gradient_and_leaves_the_probe_alone():
    """optim.grad_clip is the method's: the online probe beside it trains on its own, unclipped gradient."""
    import copy

    from solo.train.step import TrainStep
    from solo.train.trainer import build_model

    torch.manual_seed(0)
    model = build_model(compose_cfg(TINY + ["trainer.precision=64"]), num_classes=10).double()
    batch = {"views": [torch.randn(8, 3, 16, 16, dtype=torch.float64) for _ in range(2)], "label": torch.arange(8) % 10}
    reference = copy.deepcopy(model)
    out = reference(batch)
    (out["loss"] + out["probe_loss"]).backward()
    probe_grads = [p.grad.clone() for p in reference.probe.parameters()]
    method_norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in reference.method.parameters() if p.grad is not None])
    )
    clip = float(method_norm) / 10  # so that clipping scales the method's gradient by 1/10

    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(
        [{"params": list(model.method.parameters())}, {"params": list(model.probe.parameters())}], lr=1.0
    )
    TrainStep(
        model,
        model,
        optimizer,
        precision="64",
        device=torch.device("cpu"),
        schedule=lambda i: 1.0,
        total_steps=1,
        grad_clip=clip,
    )(batch, 0)
    deltas = {name: before[i] - p.detach() for i, (name, p) in enumerate(model.named_parameters())}
    method_step = torch.linalg.vector_norm(
        torch.stack([d.norm() for n, d in deltas.items() if n.startswith("method.")])
    )
    assert method_step == pytest.approx(clip, rel=1e-6)  # torch divides by the norm + 1e-6
    for (name, _p), grad in zip(model.probe.named_parameters(), probe_grads):
        torch.testing.assert_close(deltas[f"probe.{name}"], grad, rtol=1e-12, atol=0)  # unclipped: not grad / 10


def test_signal_handlers_are_given_back_when_training_ends(tmp_path):
    """A job that trains in-process (main_linear.py's fine-tuning, a notebook) gets its own SIGUSR1/SIGTERM handlers
    back from the trainer, after a normal end and after an error; a Preemption left open keeps them (the check bites)."""
    from solo.train.preemption import Preemption

    def own(signum, frame):
        pass

    previous = {sig: signal.signal(sig, own) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        pretrain(compose_cfg(TINY + ["trainer.max_steps=1", "trainer.plots=false"]), tmp_path / "ok")
        assert signal.getsignal(signal.SIGUSR1) is own and signal.getsignal(signal.SIGTERM) is own
        with pytest.raises(CheckpointError, match="trainer.resume=false"):
            pretrain(
                compose_cfg(TINY + ["trainer.max_steps=1", "trainer.resume=false"]), tmp_path / "ok"
            )  # last.pt exists
        assert signal.getsignal(signal.SIGUSR1) is own and signal.getsignal(signal.SIGTERM) is own
        Preemption(["SIGUSR1"], torch.device("cpu"))
        assert signal.getsignal(signal.SIGUSR1) is not own
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
