"""A user's first hour: no silent wrong behaviour, errors of at most 3 lines, Ctrl-C safe, one zoo API."""

import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

import solo.zoo
from solo.backbones import build_backbone
from solo.data.sources.huggingface import load_splits
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import CheckpointError, ConfigError
from solo.loggers import WandbLogger
from solo.methods.towers import open_clip_config
from solo.train.trainer import pretrain
from tests.test_train import REPO, TINY, TINY_FILES, compose_cfg, launch, metrics, weights

SHORT = TINY + ["data.batch_size=16", "trainer.max_steps=4"]


def main_pretrain(overrides, run_dir):
    """`python main_pretrain.py ...` as a user runs it: (exit code, everything it printed)."""
    result = subprocess.run(
        [sys.executable, "main_pretrain.py", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return result.returncode, (result.stdout + result.stderr).strip()


@pytest.mark.slow
@pytest.mark.one_process
def test_rerun_with_other_hyperparameters_is_refused_and_config_kept(tmp_path):
    pretrain(compose_cfg(SHORT), tmp_path)
    before = (tmp_path / "config.yaml").read_text()
    with pytest.raises(
        CheckpointError,
        match=r"optim.lr: 0.3 -> 1.0, method.temperature: 0.2 -> 0.5|method.temperature: 0.2 -> 0.5, optim.lr: 0.3 -> 1.0",
    ):
        pretrain(compose_cfg(SHORT + ["optim.lr=1.0", "method.temperature=0.5"]), tmp_path)
    assert (tmp_path / "config.yaml").read_text() == before
    # A backbone keyword given now and not then: refused by its name, before the checkpoint's tensors are read.
    with pytest.raises(
        CheckpointError, match=r"another configuration \(backbone.kwargs.channels: None -> \[32, 48, 48, 64\]\)"
    ):
        pretrain(compose_cfg(SHORT + ["+backbone.kwargs.channels=[32,48,48,64]"]), tmp_path)
    # What is safe to change resumes: a longer run, other logging.
    pretrain(compose_cfg(SHORT + ["trainer.max_steps=6", "trainer.log_every_steps=2"]), tmp_path)
    assert [m["step"] for m in metrics(tmp_path) if "train/loss" in m] == [1, 2, 3, 4, 6]


def test_choices_are_checked_when_the_config_is_composed():
    with pytest.raises(Exception) as err:
        compose_cfg(["trainer.precision=8"])
    assert "Invalid value '8', expected one of [32, bf16, 16, 64]" in str(err.value) + str(err.value.__cause__)


def test_unknown_keys_added_with_plus_are_refused():
    with pytest.raises(ConfigError, match="Key 'max_epoch' not in 'TrainerConfig'"):
        compose_cfg(["+trainer.max_epoch=3"])
    with pytest.raises(ConfigError, match="Key 'lambda' not in 'SimCLRConfig'"):
        compose_cfg(["+method.lambda=3"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            ["data=imagefolder", "data.root=/nowhere"],
            "error: imagefolder: no folder /nowhere/train",
            marks=[pytest.mark.slow, pytest.mark.one_process],
        ),
        pytest.param(
            ["data.batch_size=128"],
            "error: the global batch (128 per process x 1 processes = 128) is larger than the dataset (64",
            marks=[pytest.mark.slow, pytest.mark.one_process],
        ),  # each a fresh process: about 10 s
        pytest.param(
            ["method.temperature=0"],
            "error: method.temperature=0.0: must be > 0",
            marks=[pytest.mark.slow, pytest.mark.one_process],
        ),
        (["optim.lr=-1"], "error: optim.lr=-1.0: must be > 0"),
    ],
)
def test_bad_input_is_one_short_message(tmp_path, overrides, message):
    code, out = main_pretrain((TINY_FILES if overrides[0].startswith("data=") else TINY) + overrides, tmp_path)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith(message), out
    # Besides the error and its hint, only the run's first lines: what it chose (stem, augmentation, threads, memory).
    chosen = ("augmentation=", "backbone.small_stem=", "threads:", "memory:", "error:", "(SOLO_DEBUG=1")
    assert all(line.startswith(chosen) for line in out.splitlines()) and "Traceback" not in out, out
    # SOLO_DEBUG=1 (the whole traceback on demand): tests/test_errors.py::test_hydra_errors_are_one_line


def _images(root, bad=()):
    for cls in ("a", "b"):
        (root / "train" / cls).mkdir(parents=True)
        for i in range(12):
            Image.new("RGB", (20, 20), (i * 20, 0, 120 if cls == "a" else 0)).save(root / "train" / cls / f"{i}.png")
    for name in bad:
        (root / "train" / "b" / name).write_bytes(b"not a png at all")


@pytest.mark.slow  # 15 s: a training run with workers; the quick suite keeps under 4 min
@pytest.mark.one_process
def test_a_corrupt_image_read_by_a_worker_is_named_in_one_message(tmp_path):
    _images(tmp_path / "data", bad=["broken.png"])
    data = [
        "data=imagefolder",
        f"data.root={tmp_path / 'data'}",
        "data.batch_size=8",
        "data.num_workers=1",
        "trainer.max_steps=2",
    ]
    code, out = main_pretrain(TINY_FILES + data + ["data.check_images=0"], tmp_path / "run")
    error = out[out.index("error:") :]  # after the run's start line
    assert code == 2 and len(error.splitlines()) <= 3 and "Traceback" not in out, out
    assert error.startswith(f"error: cannot read image {tmp_path / 'data' / 'train' / 'b' / 'broken.png'}"), out
    code, out = main_pretrain(TINY_FILES + data, tmp_path / "run2")  # found at start, before training
    assert code == 2 and "images checked cannot be read" in out and "data.on_bad_image=skip" in out, out


@pytest.mark.slow
@pytest.mark.one_process
def test_ctrl_c_checkpoints_the_current_step_and_the_rerun_redoes_no_step(tmp_path):
    overrides = TINY + ["data.num_samples=256", "data.batch_size=8", "trainer.max_steps=60"]
    proc = launch(overrides, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any("train/loss" in line for line in _lines(tmp_path / "metrics.jsonl")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in out, out
    state = read_checkpoint(tmp_path / "checkpoints" / "last")
    assert 0 < state["step"] < 60 and f"SIGINT: checkpoint written at step {state['step']}" in out
    # Said when Ctrl-C arrives: where the run will stop (the next step that checks, every log_every_steps=1).
    assert f"SIGINT: stopping after step {state['step']} (signals are checked every" in out, out
    rerun = launch(overrides, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = rerun.communicate(timeout=300)
    assert f"resuming from {tmp_path / 'checkpoints' / 'last'} at step {state['step']}" in out
    steps = [m["step"] for m in metrics(tmp_path) if "train/loss" in m]
    assert steps == list(range(1, 61)), "every step trained exactly once"


@pytest.mark.slow
@pytest.mark.one_process
def test_a_signal_between_a_step_and_its_check_is_announced_for_that_step(tmp_path, monkeypatch, caplog):
    """Ctrl-C that lands after step 2 has run but before the check that follows it (here: while the step's metrics are
    summed): that check reads it, so the run stops after step 2, and the line said at once names step 2. (Naming the
    step after the one counted, as solo did, said 3 there; CI's loaded machine hit that window.)"""
    import solo.train.trainer as trainer_module

    add, calls = trainer_module.MetricsWindow.add, []

    def add_then_signal(self, *args, **kwargs):
        add(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(trainer_module.MetricsWindow, "add", add_then_signal)
    with caplog.at_level("INFO", logger="solo"):
        pretrain(compose_cfg(TINY + ["data.batch_size=8", "trainer.max_steps=6"]), tmp_path)
    assert read_checkpoint(tmp_path / "checkpoints" / "last")["step"] == 2
    assert "SIGINT: stopping after step 2 (signals are checked every" in caplog.text, caplog.text


@pytest.mark.slow
@pytest.mark.one_process
def test_a_second_ctrl_c_stops_at_once_saying_what_was_saved(tmp_path):
    # 1,024 steps an epoch (its end is the first checkpoint), checked every 100 steps: a second Ctrl-C a second in stops
    # it before any checkpoint, on any machine (CI's fast one was at step 36 with 32 steps an epoch).
    overrides = TINY + [
        "data.num_samples=8192",
        "data.batch_size=8",
        "trainer.max_steps=1100",
        "trainer.log_every_steps=100",
    ]
    proc = launch(overrides, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = iter(proc.stdout.readline, "")
    assert any(line.startswith("world size 1") for line in lines), "the run did not start"
    time.sleep(1)  # into the steps
    proc.send_signal(signal.SIGINT)
    assert any("Ctrl-C again stops at once" in line for line in lines)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    # Not the default action's silent death by signal (status -2): one line saying that nothing was saved, status 130.
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode == 130 and len(errors) == 1 and "Traceback" not in out, out
    assert errors[0].startswith("error: stopped by Ctrl-C during step") and "no checkpoint was written" in errors[0]
    assert not (tmp_path / "checkpoints" / "last").exists()


@pytest.mark.slow
@pytest.mark.one_process
def test_a_run_of_max_steps_evaluates_once_at_the_end_and_the_plot_reads_no_more(tmp_path, monkeypatch):
    from solo.data.sources.images import SyntheticDataset

    val_reads = []
    read = SyntheticDataset.__getitem__
    monkeypatch.setattr(
        SyntheticDataset,
        "__getitem__",
        lambda self, i: val_reads.append(i) or read(self, i) if self._split_id == 1 else read(self, i),
    )
    # 64 samples in batches of 16: 4 steps an epoch, so 6 steps cross an epoch's end.
    short = TINY + ["data.batch_size=16", "trainer.max_steps=6"]
    pretrain(compose_cfg(short + ["trainer.plots=true"]), tmp_path / "end")
    assert [m["step"] for m in metrics(tmp_path / "end") if "val/acc1" in m] == [6]
    assert (tmp_path / "end" / "embedding.png").exists()
    assert sorted(val_reads) == list(range(64)), "one pass over the val split: the evaluation's, which the plot reuses"
    pretrain(compose_cfg(short + ["trainer.eval_every=1"]), tmp_path / "every")
    assert [m["step"] for m in metrics(tmp_path / "every") if "val/acc1" in m] == [4, 6]


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


def test_zoo_load_takes_a_run_directory_and_resizes_any_image(tmp_path):
    pretrain(compose_cfg(SHORT), tmp_path)
    backbone, trained = solo.zoo.load(str(tmp_path)), weights(tmp_path)
    assert not backbone.training
    for key, value in backbone.state_dict().items():
        assert not value.is_floating_point() or torch.equal(value, trained["method.backbone." + key]), key
    transform = solo.zoo.eval_transform("simclr-digits-resnet18half")
    for size in (8, 100):
        assert transform(Image.new("RGB", (size, size))).shape == (3, 16, 16)
    clip = solo.zoo.load("clip-digits-resnet18half")
    tokens = solo.zoo.tokenizer("clip-digits-resnet18half")(["a handwritten 7."])
    with torch.no_grad():
        image = torch.stack([transform(Image.new("RGB", (8, 8)))])
        embedding, text = clip.encode_image(image), clip.encode_text(tokens)
        assert embedding.shape == text.shape == (1, clip.image_projection.out_features)
        assert clip.image_features(image).shape == (1, clip.feature_dim)


@pytest.mark.parametrize(
    "module, build",
    [
        ("wandb", lambda tmp: WandbLogger(tmp, OmegaConf.create({"mode": "offline"}), {})),
        ("open_clip", lambda tmp: open_clip_config("ViT-B-32", {})),
        ("datasets", lambda tmp: load_splits(str(tmp))),
    ],
)
def test_an_integration_not_installed_names_its_extra(module, build, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # what `import module` meets when the package is absent
    extra = {"wandb": "wandb", "open_clip": "open_clip", "datasets": "huggingface"}[module]
    with pytest.raises(ConfigError, match=rf"needs the {module} package: pip install 'solo\[{extra}\]'"):
        build(tmp_path)


def _views(cfg) -> list[tuple]:
    return [(v.size, v.count, tuple(v.crop_scale), v.blur_prob) for v in cfg.augmentation.views]


def _recipe(name: str) -> list[tuple]:
    recipe = OmegaConf.load(REPO / "solo" / "configs" / "augmentation" / f"{name}.yaml")
    return [(v.get("size"), v.get("count", 1), tuple(v.crop_scale), v.blur_prob) for v in recipe.views]


def test_defaults_follow_the_data_and_an_explicit_setting_wins():
    """The digits keep the small stem and the digits recipe; a 96 px folder gets the standard stem and the method's
    paper recipe (DINO's local crops scaled from 96 of 224 px to 40 of 96; DeepClusterV2, which compares two views, the
    global crops of SwAV's multi-crop); what the command line sets is kept."""
    folder = ["data=imagefolder", "data.root=/photos", "data.image_size=96"]
    digits = compose_cfg([])
    assert digits.backbone.small_stem is True and _views(digits) == _recipe("digits")
    photos = compose_cfg(folder)
    assert photos.backbone.small_stem is False and _views(photos) == _recipe("simclr")
    assert photos.augmentation.name == "simclr" and digits.augmentation.name == "digits"
    assert compose_cfg(["data=synthetic", "data.image_size=64"]).backbone.small_stem is True  # at most 64 px: small
    assert compose_cfg(["method=mae"]).augmentation.name == "one_view_digits"
    assert compose_cfg(["method=mae", *folder]).augmentation.name == "mae"
    dino = compose_cfg(["method=dino", *folder])
    assert [(v.size, v.count) for v in dino.augmentation.views] == [(None, 1), (None, 1), (40, 8)]
    swav_globals = [v for v in _recipe("multicrop_swav") if v[0] is None]
    assert _views(compose_cfg(["method=deepclusterv2", *folder])) == swav_globals
    explicit = compose_cfg([*folder, "backbone.small_stem=true", "augmentation=digits"])
    assert explicit.backbone.small_stem is True and _views(explicit) == _recipe("digits")
    assert compose_cfg(["backbone.small_stem=false"]).backbone.small_stem is False
    written = compose_cfg([*folder, "augmentation.views=[{crop_scale:[0.5,1.0]},{crop_scale:[0.5,1.0]}]"])
    assert [tuple(v.crop_scale) for v in written.augmentation.views] == [(0.5, 1.0)] * 2


def test_a_vits_patches_and_the_pixel_sizes_of_its_methods_follow_the_data():
    """The masked-image methods' ViT takes 4 px patches on the 16 px digits (a 4 x 4 grid) and 16 px ones on 224 px
    photos (14 x 14, not 56 x 56); SimMIM's mask squares are the paper's 32 px at 224 px and one patch on the digits,
    MaskFeat's HOG cells half a patch (the paper's 8 px), multi-crop's local crops whole patches; an explicit value
    wins; the backbone is built with them."""
    photos = ["data=imagefolder", "data.root=/photos", "data.image_size=224"]

    def sizes(cfg):
        return cfg.backbone.kwargs.patch_size, cfg.method.get("mask_patch_size"), cfg.method.get("hog_cell")

    assert sizes(compose_cfg(["method=simmim"])) == (4, 4, None)
    assert sizes(compose_cfg(["method=simmim", *photos])) == (16, 32, None)
    assert sizes(compose_cfg(["method=simmim", *photos[:2], "data.image_size=96"])) == (16, 16, None)  # 13.7 px: 1
    assert sizes(compose_cfg(["method=maskfeat"])) == (4, None, 2)
    assert sizes(compose_cfg(["method=maskfeat", *photos])) == (16, None, 8)
    # Sizes that tile whatever the patch: 7 px patches at 224 px (a 32 x 32 grid) take 28 px squares, 1 px cells.
    assert sizes(compose_cfg(["method=simmim", *photos, "backbone.kwargs.patch_size=7"])) == (7, 28, None)
    assert sizes(compose_cfg(["method=maskfeat", *photos, "backbone.kwargs.patch_size=7"])) == (7, None, 1)
    chosen = ["backbone.kwargs.patch_size=8", "method.hog_cell=4"]
    assert sizes(compose_cfg(["method=maskfeat", *photos, *chosen])) == (8, None, 4)
    # The name's patch where there is one: a ViT-S/8 keeps its 8 px patches on large images.
    assert compose_cfg(["method=mae", *photos, "backbone.name=vit_small_patch8_224"]).backbone.kwargs.patch_size == 8

    # Multi-crop's local crops, scaled to the image, tile into the patches: DINOv2's 96 px of 224 at 64 px are 27.4 px,
    # two 16 px patches (they were 24 px, which the patch grid check refused); at 224 px a 14 px patch takes 98 px.
    def local_crops(*more):
        return [v.size for v in compose_cfg(["method=dinov2", *photos, *more]).augmentation.views][2:]

    assert local_crops("data.image_size=64", "backbone.kwargs.patch_size=16") == [32]
    assert local_crops("backbone.name=vit_small_patch14_dinov2") == [98]
    assert local_crops() == [96]
    backbone, _ = build_backbone(compose_cfg(["method=mae", *photos]).backbone)
    assert backbone.patch_embed.grid_size == (14, 14)
    with pytest.raises(ValueError, match="patch_size=auto follows data.image_size"):
        build_backbone({"name": "vit_tiny_patch16_224", "small_stem": False, "kwargs": {"patch_size": "auto"}})


def test_saved_activations_are_counted_once_without_the_weights():
    """A Linear's backward keeps its input (8 x 100 floats) and weight, ReLU's its output (8 x 50); the weight is the
    model's, not an activation (an input that needs a gradient, as a block's inside a network, has the weight kept)."""
    from solo.train.estimates import saved_bytes

    linear, x = torch.nn.Linear(100, 50), torch.randn(8, 100, requires_grad=True)
    weights = {p.untyped_storage().data_ptr() for p in linear.parameters()}
    assert saved_bytes(lambda: torch.relu(linear(x)), weights) == (8 * 100 + 8 * 50) * 4
    assert saved_bytes(lambda: torch.relu(linear(x)), set()) == (8 * 100 + 8 * 50 + 100 * 50) * 4  # weights counted


def test_the_cpu_time_probe_skips_a_batch_the_loss_refuses_and_raises_anything_else():
    """W-MSE's loss refuses the probe's 2 samples (a ValueError, alike on every rank, which probe the same samples): no
    estimate. Any other error is raised, not swallowed: a rank that went on alone would leave the others waiting in the
    probe's collectives."""
    from solo.losses import wmse_loss
    from solo.train.estimates import step_seconds

    class Loss(torch.nn.Module):
        def __init__(self, loss):
            super().__init__()
            self.layer, self.loss = torch.nn.Linear(4, 8), loss

        def forward(self, batch):
            z = self.layer(batch["x"])
            return {"loss": self.loss(z[:1], z[1:])}

    batch = {"x": torch.randn(2, 4)}
    assert step_seconds(Loss(lambda a, b: (a - b).pow(2).sum()), batch, 64, nullcontext) > 0
    assert step_seconds(Loss(lambda a, b: wmse_loss(a, b, 64, 0.0)), batch, 64, nullcontext) is None

    def broken(a, b):
        raise RuntimeError("a collective's peer is gone")

    with pytest.raises(RuntimeError, match="peer is gone"):
        step_seconds(Loss(broken), batch, 64, nullcontext)


@pytest.mark.slow  # whole runs: the quick suite keeps under 4 min
@pytest.mark.one_process
def test_a_step_that_cannot_fit_stops_before_it_with_one_line_naming_the_keys(tmp_path):
    with pytest.raises(ConfigError) as stopped:
        pretrain(compose_cfg(SHORT + ["trainer.memory_limit_gib=0.05"]), tmp_path / "limited")
    message = str(stopped.value)
    assert len(message.splitlines()) == 1 and "0.1 GiB available" not in message and "0.05" not in message
    for key in ("data.batch_size=16", "data.image_size=16", "trainer.precision=bf16", "trainer.memory_check=false"):
        assert key in message, message
    assert not (tmp_path / "limited" / "checkpoints").exists()  # stopped before the first step
    pretrain(compose_cfg(SHORT + ["trainer.memory_limit_gib=0.05", "trainer.memory_check=false"]), tmp_path / "skipped")
    assert metrics(tmp_path / "skipped")[-1]["step"] == 4


@pytest.mark.slow  # whole runs: the quick suite keeps under 4 min
@pytest.mark.one_process
def test_a_killed_data_worker_is_named_with_what_to_try(tmp_path, monkeypatch):
    """The kernel's out-of-memory killer often takes a data-loading worker: the run says so, not a torch traceback."""
    from solo.data import MultiViewDataset
    from solo.errors import DataError

    read = MultiViewDataset.__getitems__

    def killed_in_a_worker(self, keys):  # never this process (the test's): only a DataLoader worker is killed
        return os.kill(os.getpid(), signal.SIGKILL) if torch.utils.data.get_worker_info() else read(self, keys)

    monkeypatch.setattr(MultiViewDataset, "__getitems__", killed_in_a_worker)
    with pytest.raises(DataError, match=r"data.num_workers=1: a data-loading worker died .* out of memory"):
        pretrain(compose_cfg(SHORT + ["data.num_workers=1", "trainer.memory_check=false"]), tmp_path)


@pytest.mark.slow  # whole runs: the quick suite keeps under 4 min
@pytest.mark.one_process
def test_threads_are_the_process_share_of_the_cores(tmp_path, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        pretrain(compose_cfg(SHORT + ["trainer.max_steps=1", "data.num_workers=1"]), tmp_path / "auto")
        assert torch.get_num_threads() == cores  # on the CPU the model computes on all of them, beside its worker
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's (or torchrun's) setting
        pretrain(compose_cfg(SHORT + ["trainer.max_steps=1"]), tmp_path / "omp")
        assert torch.get_num_threads() == 1
        pretrain(compose_cfg(SHORT + ["trainer.max_steps=1", "trainer.threads=3"]), tmp_path / "set")
        assert torch.get_num_threads() == 3  # an explicit setting wins
    finally:
        torch.set_num_threads(1)  # this test worker's own (tests/conftest.py)
