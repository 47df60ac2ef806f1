"""method=lit: the locked image tower loaded from each kind of source without a network (the digits CLIP zoo entry's
image tower, a timm model and an open_clip model this test builds and saves), locked (bit-identical through optimizer
steps, eval mode, no gradient, in no optimizer group) while the text tower and the image projection learn; its loss
against CLIP's and SigLIP's formulas written out here; clear errors. Its world-size invariance and exact resume:
tests/test_methods.py."""

import math

import open_clip
import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import solo.zoo
from solo.data import dataset_stats
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.optim import param_groups
from solo.train.trainer import build_model, build_optimizer_for, pretrain
from tests.test_distill import normalised, raw_images
from tests.test_open_clip import MODEL_CFG, NAME
from tests.test_train import TINY_FILES, compose_cfg, metrics

TEXT = ["method.embed_dim=16", "method.text.width=16", "method.text.depth=1", "method.text.heads=2"]
BASE = [o for o in TINY_FILES if not o.startswith(("method.", "backbone"))] + ["data=digits", "method=lit", *TEXT]


def batch_of(method, n: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    captions = [f"a photo of the digit {i % 10}" for i in range(n)]
    return {
        "image": torch.randn(n, 3, 16, 16, generator=g),
        "text": method.tokenizer(captions),
        "label": torch.arange(n) % 10,
        "index": torch.arange(n),
    }


# --- where the tower comes from --------------------------------------------------------------------------------------


def test_the_default_tower_is_the_digits_clip_entrys_image_tower():
    """The zoo's CLIP model's backbone, as loaded, with nothing renormalised (the same data statistics)."""
    model = build_model(compose_cfg(BASE), None)
    images = normalised(raw_images(), dataset_stats("digits"))
    clip = solo.zoo.load("clip-digits-resnet18half")
    with torch.no_grad():
        torch.testing.assert_close(model.method.image_features(images), clip.image_features(images))
    assert not model.method.backbone.renormalise and model.method.image_projection.in_features == 256


def test_a_timm_tower_loads_from_its_weights_file(tmp_path):
    torch.manual_seed(3)
    tower = timm.create_model("test_resnet", num_classes=0).eval()
    save_file({k: v.contiguous() for k, v in tower.state_dict().items()}, str(tmp_path / "tower.safetensors"))
    cfg = compose_cfg(BASE + ["method.teacher=test_resnet", f"method.teacher_weights={tmp_path / 'tower.safetensors'}"])
    torch.manual_seed(4)  # another initialisation: only the file's weights make the outputs equal
    method = build_model(cfg, None).method
    raw = raw_images()
    with torch.no_grad():
        ours = method.image_features(normalised(raw, dataset_stats("digits")))
        theirs = tower(normalised(raw, (tower.pretrained_cfg["mean"], tower.pretrained_cfg["std"])))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert method.image_projection.in_features == tower.num_features


def test_an_open_clip_tower_is_its_image_tower(tmp_path):
    torch.manual_seed(5)
    clip = open_clip.create_model(NAME, **MODEL_CFG).eval()
    torch.save(clip.state_dict(), tmp_path / "clip.bin")
    cfg = compose_cfg(
        BASE
        + [f"method.teacher=open_clip:{NAME}", f"method.teacher_weights={tmp_path / 'clip.bin'}"]
        + [
            f"+method.teacher_kwargs.{k}.{leaf}={v}"
            for k, part in MODEL_CFG.items()
            if isinstance(part, dict)
            for leaf, v in part.items()
        ]
        + [f"+method.teacher_kwargs.{k}={v}" for k, v in MODEL_CFG.items() if not isinstance(v, dict)]
    )
    method = build_model(cfg, None).method
    raw = raw_images()
    with torch.no_grad():
        ours = method.image_features(normalised(raw, dataset_stats("digits")))
        theirs = clip.encode_image(normalised(raw, (clip.visual.image_mean, clip.visual.image_std)))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_tower_that_is_no_source_is_one_config_error():
    with pytest.raises(ConfigError, match=r"^method.teacher=nowhere is neither a solo zoo name \(") as e:
        build_model(compose_cfg(BASE + ["method.teacher=nowhere"]), None)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^method.loss_tile=auto: tiles CLIP's loss, .*set method.loss_tile=none$"):
        compose_cfg(BASE + ["method.loss=siglip", "method.loss_tile=auto"])


# --- locked ----------------------------------------------------------------------------------------------------------


def test_the_tower_stays_bit_identical_while_the_text_tower_learns():
    """Three optimizer steps (the default LARS, weight decay on): the tower's weights and BatchNorm statistics are as
    loaded, it stays in eval mode under model.train(), takes no gradient and is in no optimizer group; the text tower,
    the image projection and the logit scale move. Under autocast the tower computes in bf16 without a graph."""
    torch.manual_seed(0)
    cfg = compose_cfg(BASE)
    model = build_model(cfg, 10).train()
    method, tower = model.method, model.method.backbone
    before = {k: v.clone() for k, v in method.state_dict().items()}
    optimizer = build_optimizer_for(model, cfg.optim, 0.1)
    for step in range(3):
        out = model(batch_of(method, seed=step))
        optimizer.zero_grad()
        (out["loss"] + out["probe_loss"]).backward()
        optimizer.step()
    after = method.state_dict()
    locked = [k for k in before if k.startswith("backbone.")]
    assert locked and all(torch.equal(before[k], after[k]) for k in locked), "the locked tower moved"
    for trained in ("text_tower.token_embedding.weight", "image_projection.weight", "log_logit_scale"):
        assert not torch.equal(before[trained], after[trained]), trained
    assert not tower.training and not any(m.training for m in tower.modules())
    assert all(not p.requires_grad and p.grad is None for p in tower.parameters())
    grouped = {id(p) for group in param_groups(method, 1e-4, exclude_bias_and_norm=True) for p in group["params"]}
    assert not grouped & {id(p) for p in tower.parameters()}
    assert len(grouped) == sum(1 for p in method.parameters() if p.requires_grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        encoded = method.encode(batch_of(method))
    assert encoded["image"].dtype == torch.bfloat16 and not encoded["image"].requires_grad
    assert encoded["text"].requires_grad
    # The check can fail: a tower put in train mode moves its running statistics, batch by batch.
    torch.nn.Module.train(tower, True)
    tower(batch_of(method)["image"])
    assert any(not torch.equal(before[k], v) for k, v in method.state_dict().items() if "running" in k)


# --- the loss --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss, image_head", [("clip", True), ("siglip", False)])
def test_loss_is_the_papers_on_the_locked_and_projected_features(loss, image_head):
    """clip: the mean of the two directions' cross-entropy over the scaled cosine matrix; siglip: sum over every pair
    of -log sigmoid(label (t cos + b)) / N. The image embedding is the projected locked features (image_head), or the
    locked features themselves, the text tower then projecting to their width. Known-wrong variants (CLIP's one
    direction only; SigLIP without its bias) differ."""
    torch.manual_seed(1)
    overrides = [f"method.loss={loss}", f"method.image_head={str(image_head).lower()}", "method.init_bias=-2.0"]
    method = build_model(compose_cfg(BASE + overrides), None).method.double()
    batch = batch_of(method, n=6)
    batch["image"] = batch["image"].double()
    out = method(batch)
    with torch.no_grad():
        features = method.backbone(batch["image"])
        image = F.normalize(method.image_projection(features) if image_head else features, dim=1)
        text = F.normalize(method.text_projection(method.text_tower(batch["text"])), dim=1)
    scale, n = math.exp(float(method.log_logit_scale.detach())), len(image)
    cos = image @ text.T
    if loss == "clip":
        logits, labels = scale * cos, torch.arange(n)
        expected = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        wrong = F.cross_entropy(logits, labels)
    else:
        signs = 2 * torch.eye(n, dtype=cos.dtype) - 1
        expected = -F.logsigmoid(signs * (scale * cos + float(method.bias))).sum() / n
        wrong = -F.logsigmoid(signs * scale * cos).sum() / n
    assert float(out["loss"].detach()) == pytest.approx(float(expected), rel=1e-12)
    assert float(wrong) != pytest.approx(float(expected), rel=1e-3)
    torch.testing.assert_close(out["features"], features)
    assert text.shape[1] == (16 if image_head else 256)  # method.embed_dim, or the locked features' width


# --- a run -----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.one_process
def test_a_run_logs_zero_shot_saves_its_tower_and_reloads_as_a_model(tmp_path):
    """Two steps: val zero-shot accuracy and retrieval logged as CLIP's; the checkpoint holds the tower as loaded (what
    a resumed run reads back); solo.zoo.load of the run directory is the whole model (the tower, the trained text
    tower), in eval mode, with the run's embeddings."""
    pretrain(compose_cfg(BASE + ["trainer.max_steps=2", "data.batch_size=32"]), tmp_path / "run")
    rows = metrics(tmp_path / "run")
    assert {"val/zeroshot_acc1", "val/i2t_recall1", "val/acc1"} <= rows[-1].keys()
    assert any("train/logit_scale" in r for r in rows)
    saved = read_checkpoint(tmp_path / "run" / "checkpoints" / "last")["model"]
    zoo = solo.zoo.resolve("clip-digits-resnet18half").state
    tower = {k.removeprefix("backbone."): v for k, v in zoo.items() if k.startswith("backbone.")}
    assert all(torch.equal(saved[f"method.backbone.encoder.{k}"], v) for k, v in tower.items())
    model = solo.zoo.load(str(tmp_path / "run"))
    assert all(torch.equal(v, saved[f"method.{k}"]) for k, v in model.state_dict().items())
    assert not model.training
