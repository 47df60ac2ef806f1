"""method=distill: its loss against the formulas written out here (value and gradient); the frozen teacher loaded from
each kind of source without a network (a timm model and an open_clip model this test builds and saves, a solo zoo
entry, a pretraining run directory), renormalised to its own statistics; frozen (no gradient, no optimizer, eval mode
whatever the model's, not moved by steps); patch tokens on the student's grid; the teacher-student agreement; clear
errors. Its world-size invariance, FSDP layouts and exact resume: tests/test_methods.py, tests/test_strategies.py."""

import subprocess
import sys

import open_clip
import pytest
import timm
import torch
import torch.nn as nn
from omegaconf import OmegaConf
from safetensors.torch import save_file

import solo.zoo
from solo.data import dataset_stats
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.eval.health import teacher_agreement
from solo.losses import feature_distillation_loss
from solo.methods.distill import on_grid
from solo.optim import param_groups
from solo.train.trainer import build_model, pretrain
from solo.zoo.teachers import load_teacher
from tests.test_errors import ENV, assert_one_error_line
from tests.test_open_clip import MODEL_CFG, NAME
from tests.test_train import REPO, TINY, compose_cfg, metrics

BASE = [o for o in TINY if not o.startswith("method.")] + ["method=distill"]
DIGITS = OmegaConf.create({"name": "digits", "image_size": 16})


def teacher_cfg(teacher: str, weights=None, **kwargs):
    return OmegaConf.create({"teacher": teacher, "teacher_weights": weights, "teacher_kwargs": kwargs})


def raw_images(n: int = 4, size: int = 16) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def normalised(raw: torch.Tensor, stats) -> torch.Tensor:
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in stats)
    return (raw - mean) / std


# --- the loss --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cosine", "mse"])
@pytest.mark.parametrize("tokens", [False, True])
def test_loss_and_gradient_are_the_formulas(kind, tokens):
    """cosine: mean_i (1 - s_i.t_i / (|s_i| |t_i|)), gradient -(t_i/|t_i| - cos_i s_i/|s_i|) / (|s_i| n); mse:
    mean_i mean_d (s_id - t_id)^2, gradient 2 (s - t) / (n D); over (B, T, D) tokens each of the B T rows weighs the
    same. No gradient reaches the teacher."""
    g = torch.Generator().manual_seed(1)
    shape = (3, 4, 5) if tokens else (6, 5)
    s = torch.randn(shape, dtype=torch.float64, generator=g).requires_grad_()
    t = torch.randn(shape, dtype=torch.float64, generator=g).requires_grad_()
    loss = feature_distillation_loss(s, t, kind)
    loss.backward()
    rows_s, rows_t = s.detach().reshape(-1, 5), t.detach().reshape(-1, 5)
    n = len(rows_s)
    if kind == "cosine":
        s_norm, t_norm = rows_s.norm(dim=1, keepdim=True), rows_t.norm(dim=1, keepdim=True)
        cos = (rows_s * rows_t).sum(dim=1, keepdim=True) / (s_norm * t_norm)
        expected = float((1 - cos).mean())
        gradient = -(rows_t / t_norm - cos * rows_s / s_norm) / s_norm / n
    else:
        expected = float((rows_s - rows_t).pow(2).mean())
        gradient = 2 * (rows_s - rows_t) / (n * 5)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(s.grad.reshape(-1, 5), gradient, rtol=1e-10, atol=1e-14)
    assert t.grad is None
    # The known slip: the squared error summed over the dimensions (F.mse_loss's "sum" per row) is D times the mean.
    if kind == "mse":
        assert float((rows_s - rows_t).pow(2).sum(dim=1).mean()) != pytest.approx(float(loss.detach()), rel=1e-3)


def test_agreement_is_the_mean_cosine():
    t = torch.randn(5, 3, generator=torch.Generator().manual_seed(2))
    assert teacher_agreement(t * (torch.rand(5, 1) + 0.5), t) == pytest.approx(1.0)
    assert teacher_agreement(-2 * t, t) == pytest.approx(-1.0)
    pairs = torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert teacher_agreement(*pairs) == pytest.approx((0.0 + 2**-0.5) / 2)


def test_teacher_patches_are_interpolated_to_the_students_grid():
    """A linear ramp f(r, c) = r + 10 c on a 4 x 4 grid, bilinearly resampled to 2 x 2 (pixel centres, not corners):
    the ramp at rows and columns 0.5 and 2.5, row-major; on its own grid the tokens are left alone."""
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    ramp = (rows + 10 * cols).reshape(1, 16, 1).repeat(2, 1, 3)  # (B, 16 tokens, D)
    expected = torch.tensor([0.5 + 5, 0.5 + 25, 2.5 + 5, 2.5 + 25]).reshape(1, 4, 1).expand(2, 4, 3)
    torch.testing.assert_close(on_grid(ramp, (4, 4), (2, 2)), expected)
    assert on_grid(ramp, (4, 4), (4, 4)) is ramp


# --- where the teacher comes from ------------------------------------------------------------------------------------


def test_a_timm_teacher_loads_from_its_weights_file_and_sees_its_own_normalisation(tmp_path):
    """timm's model by name, its weights from the file this test saved: the same outputs as the saved model on images
    normalised with timm's statistics, given views normalised with the digits' (solo renormalises)."""
    torch.manual_seed(3)
    model = timm.create_model("test_resnet", num_classes=0).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "teacher.safetensors"))
    torch.manual_seed(4)  # the teacher's own initialisation would differ: only the file's weights make them equal
    teacher = load_teacher(teacher_cfg("test_resnet", str(tmp_path / "teacher.safetensors")), DIGITS)
    raw = raw_images()
    with torch.no_grad():
        ours = teacher(normalised(raw, dataset_stats("digits")))
        theirs = model(normalised(raw, (model.pretrained_cfg["mean"], model.pretrained_cfg["std"])))
        unrenormalised = model(normalised(raw, dataset_stats("digits")))
    assert teacher.width == model.num_features and teacher.renormalise
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - unrenormalised).abs().max() > 1e-2  # the views as they come would be another input


def test_an_open_clip_teacher_is_its_image_tower(tmp_path):
    torch.manual_seed(5)
    model = open_clip.create_model(NAME, **MODEL_CFG).eval()
    torch.save(model.state_dict(), tmp_path / "clip.bin")
    teacher = load_teacher(teacher_cfg(f"open_clip:{NAME}", str(tmp_path / "clip.bin"), **MODEL_CFG), DIGITS)
    raw = raw_images()
    with torch.no_grad():
        ours = teacher(normalised(raw, dataset_stats("digits")))
        theirs = model.encode_image(normalised(raw, (model.visual.image_mean, model.visual.image_std)))
    assert teacher.width == MODEL_CFG["embed_dim"]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_zoo_teacher_is_the_zoo_backbone():
    """The digits SimCLR checkpoint on the digits: solo.zoo.load's backbone, with nothing renormalised."""
    teacher = load_teacher(teacher_cfg("simclr-digits-resnet18half"), DIGITS)
    images = normalised(raw_images(), dataset_stats("digits"))
    with torch.no_grad():
        torch.testing.assert_close(teacher(images), solo.zoo.load("simclr-digits-resnet18half")(images))
    assert not teacher.renormalise and teacher.width == 256


def test_a_teacher_that_is_no_source_is_one_config_error():
    with pytest.raises(ConfigError, match=r"^method.teacher=simclr-digits-resnet18 is neither a solo zoo name \(") as e:
        load_teacher(teacher_cfg("simclr-digits-resnet18"), DIGITS)
    assert "\n" not in str(e.value) and "timm model name" in str(e.value) and "open_clip:<model>" in str(e.value)
    with pytest.raises(
        ConfigError,
        match=r"^method.teacher_weights=/some/file.safetensors: method.teacher=simclr-digits-resnet18half is",
    ):
        load_teacher(teacher_cfg("simclr-digits-resnet18half", "/some/file.safetensors"), DIGITS)
    with pytest.raises(ConfigError, match=r"^method.teacher_weights=/nowhere.bin: no such file"):
        load_teacher(teacher_cfg("test_resnet", "/nowhere.bin"), DIGITS)
    with pytest.raises(ConfigError, match=r"^method.teacher_weights=None: the teacher open_clip:ViT-B-32 needs"):
        load_teacher(teacher_cfg(f"open_clip:{NAME}"), DIGITS)


def test_patch_tokens_need_two_vits():
    with pytest.raises(ConfigError, match=r"method.patch_weight=0.5: .* the student \(backbone\) is a ResNet"):
        build_model(compose_cfg(BASE + ["method.patch_weight=0.5"]), None)


# --- frozen ----------------------------------------------------------------------------------------------------------


def test_the_teacher_is_frozen_in_eval_mode_and_the_student_learns():
    """model.train() leaves the teacher in eval mode: its BatchNorm uses (and keeps) its running statistics. Its
    parameters take no gradient and are in no optimizer group; the student's take one. It runs in the step's precision
    (bf16 under autocast)."""
    torch.manual_seed(0)
    model = build_model(compose_cfg(BASE), 10).train()
    method, teacher = model.method, model.method.teacher
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    batch = {"views": [torch.randn(8, 3, 16, 16)], "label": torch.arange(8) % 10, "index": torch.arange(8)}
    out = model(batch)
    (out["loss"] + out["probe_loss"]).backward()
    assert not teacher.training and not any(m.training for m in teacher.modules())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items()), "the teacher's state moved"
    assert all(not p.requires_grad and p.grad is None for p in teacher.parameters())
    assert (
        all(p.grad is not None for p in method.backbone.parameters()) and method.projector.weight.grad.abs().sum() > 0
    )
    trained = {id(p) for group in param_groups(method, 0.0) for p in group["params"]}
    assert not trained & {id(p) for p in teacher.parameters()} and len(trained) == sum(
        1 for p in method.parameters() if p.requires_grad
    )
    # Under the step's autocast the teacher computes in its precision too, without a graph.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        encoded = method.encode(batch)
    assert encoded["teacher"].dtype == encoded["features"].dtype == torch.bfloat16
    assert not encoded["teacher"].requires_grad and encoded["features"].requires_grad
    # The check can fail: a teacher in train mode would move its running statistics, batch by batch.
    nn.Module.train(teacher, True)
    teacher(batch["views"][0])
    assert any(not torch.equal(before[k], v) for k, v in teacher.state_dict().items() if "running" in k)


@pytest.mark.slow
@pytest.mark.one_process
def test_a_run_keeps_its_teacher_logs_agreement_and_is_itself_a_teacher(tmp_path, caplog):
    """Three steps: the run's first lines name the teacher; the checkpoint holds the teacher as loaded (what a resumed
    run reads back), every evaluation (each epoch's end, trainer.eval_every=1) logs val/teacher_agreement; the run
    directory then serves as a teacher: its student's backbone."""
    with caplog.at_level("INFO", logger="solo"):
        pretrain(
            compose_cfg(BASE + ["trainer.max_steps=3", "data.batch_size=32", "trainer.eval_every=1"]), tmp_path / "run"
        )
    named = "teacher: method.teacher=simclr-digits-resnet18half, frozen, features 256 wide, the views renormalised"
    assert named in caplog.text, caplog.text
    saved = read_checkpoint(tmp_path / "run" / "checkpoints" / "last")["model"]
    zoo = solo.zoo.resolve("simclr-digits-resnet18half").state
    assert all(torch.equal(saved[f"method.teacher.encoder.{k}"], v) for k, v in zoo.items())
    logged = [r["val/teacher_agreement"] for r in metrics(tmp_path / "run") if "val/teacher_agreement" in r]
    assert len(logged) == 2 and all(-1 <= a <= 1 for a in logged)  # 2 steps per epoch: 2 epoch ends
    teacher = load_teacher(
        teacher_cfg(str(tmp_path / "run")), OmegaConf.create({"name": "synthetic", "image_size": 16})
    )
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(teacher(images), solo.zoo.load(str(tmp_path / "run"))(images))


@pytest.mark.slow
@pytest.mark.one_process
def test_a_bad_teacher_stops_main_pretrain_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "main_pretrain.py", "method=distill", "method.teacher=nowhere", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    where = ((result.stdout, result.stderr), result.returncode)
    assert_one_error_line(where, "error: method.teacher=nowhere is neither a solo zoo name", "main_pretrain.py")
