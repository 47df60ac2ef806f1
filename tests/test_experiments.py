"""Recipe presets in configs/experiment/: each composes under the typed schema, picks the intended groups and carries
the cited numbers. Composition only (and one `--cfg job` subprocess), no training."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf
from torch import nn

import solo.config
from solo.config import PretrainConfig, validate_pretrain
from solo.methods.barlow_twins import BarlowTwinsConfig
from solo.methods.clip import CLIPConfig
from solo.methods.simclr import SimCLRConfig
from solo.data.transforms import ViewAugmentation
from solo.train.optim import LARS, param_groups

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))

# View tuples: (brightness, contrast, saturation, hue, jitter_prob, grayscale_prob, blur_prob, solarize_prob, crop min).
SIMCLR_CIFAR_VIEW = (0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.0, 0.0, 0.08)  # strength 0.5, no blur (SimCLR B.9)
SIMCLR_IMAGENET_VIEW = (0.8, 0.8, 0.8, 0.2, 0.8, 0.2, 0.5, 0.0, 0.08)  # strength 1.0 + blur (SimCLR appendix A)
BT_CIFAR_VIEWS = [(0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.0, 0.0, 0.08), (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.0, 0.2, 0.08)]
BYOL_VIEWS = [(0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.08), (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.08)]

_SIMCLR_CIFAR = {
    "method.name": "simclr", "backbone.name": "resnet18", "backbone.small_stem": True,
    "method.temperature": 0.2, "method.proj_hidden_dim": 2048, "method.proj_output_dim": 256,
    "data.batch_size": 256, "optim.name": "lars", "optim.lr": 0.4, "optim.lr_scaling": "linear", "optim.eta": 0.02,
    "optim.weight_decay": 1e-4, "optim.warmup_epochs": 10, "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000, "views": [SIMCLR_CIFAR_VIEW] * 2,
}
_BT_CIFAR = {
    "method.name": "barlow_twins", "backbone.name": "resnet18", "backbone.small_stem": True,
    "method.proj_hidden_dim": 2048, "method.proj_output_dim": 2048, "method.lambd": 0.0051, "method.scale_loss": 0.1,
    "data.batch_size": 256, "optim.name": "lars", "optim.lr": 0.3, "optim.lr_scaling": "linear", "optim.eta": 0.02,
    "optim.weight_decay": 1e-4, "optim.warmup_epochs": 10, "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000, "views": BT_CIFAR_VIEWS,
}
_SIMCLR_IMAGENET = {
    "method.name": "simclr", "backbone.name": "resnet50", "backbone.small_stem": False, "data.name": "imagefolder",
    "data.image_size": 224, "data.batch_size": 128, "method.temperature": 0.1, "method.proj_hidden_dim": 2048,
    "method.proj_output_dim": 128, "optim.name": "lars", "optim.lr": 0.3, "optim.lr_scaling": "linear",
    "optim.eta": 0.001, "optim.weight_decay": 1e-6, "optim.warmup_epochs": 10, "optim.final_lr": 0.0,
    "optim.exclude_bias_and_norm": True, "trainer.max_epochs": 100, "views": [SIMCLR_IMAGENET_VIEW] * 2,
}
_BT_IMAGENET = {
    "method.name": "barlow_twins", "backbone.name": "resnet50", "backbone.small_stem": False,
    "data.name": "imagefolder", "data.image_size": 224, "data.batch_size": 64, "method.proj_hidden_dim": 8192,
    "method.proj_output_dim": 8192, "method.lambd": 0.0051, "method.scale_loss": 1.0, "optim.name": "lars",
    "optim.lr": 0.2, "optim.lr_scaling": "linear", "optim.eta": 0.001, "optim.weight_decay": 1.5e-6,
    "optim.warmup_epochs": 10, "optim.final_lr": 1.6e-3, "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000, "views": BYOL_VIEWS,
}

# The cited numbers, per recipe (see each file's header for the source of each).
EXPECTED = {
    "simclr_cifar10": {**_SIMCLR_CIFAR, "data.name": "cifar10"},
    "simclr_cifar100": {**_SIMCLR_CIFAR, "data.name": "cifar100"},
    "barlow_twins_cifar10": {**_BT_CIFAR, "data.name": "cifar10"},
    "barlow_twins_cifar100": {**_BT_CIFAR, "data.name": "cifar100"},
    "simclr_imagenet": _SIMCLR_IMAGENET,
    "barlow_twins_imagenet": _BT_IMAGENET,
    "simclr_imagenet_resnet18": {
        **_SIMCLR_IMAGENET, "backbone.name": "resnet18", "optim.lr": 1.2, "optim.lr_scaling": "sqrt",
    },
    "barlow_twins_imagenet_resnet18": {
        **_BT_IMAGENET, "backbone.name": "resnet18", "data.batch_size": 128, "optim.final_lr": 2e-4,
    },
}
# CLIP (Radford et al. 2021, sec. 2.5, appendix F): AdamW beta2 0.98, weight decay 0.2, lr 5e-4 for RN50,
# text Transformer 512 wide, 12 layers, 8 heads, context 77, embedding 1024 for RN50, 32 epochs.
CLIP_EXPECTED = {
    "method.name": "clip", "backbone.name": "resnet50", "data.name": "csv", "optim.name": "adamw",
    "optim.lr": 5e-4, "optim.weight_decay": 0.2, "optim.betas": [0.9, 0.98], "method.embed_dim": 1024,
    "method.text.width": 512, "method.text.depth": 12, "method.text.heads": 8, "method.text.context_length": 77,
    "method.init_logit_scale": 1 / 0.07, "method.max_logit_scale": 100.0, "trainer.max_epochs": 32,
}


def test_clip_recipe_cited_numbers():
    cfg = _compose("experiment=clip_csv_resnet50")
    for key, value in CLIP_EXPECTED.items():
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-9), key
        elif isinstance(value, list):
            assert list(got) == value, key
        else:
            assert got == value, key


def _compose(*overrides: str):
    solo.config.register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return validate_pretrain(compose("pretrain", overrides=list(overrides)))


def _view_tuple(v) -> tuple:
    return (v.brightness, v.contrast, v.saturation, v.hue, v.jitter_prob, v.grayscale_prob, v.blur_prob,
            v.solarize_prob, v.crop_scale[0])


def test_every_documented_recipe_is_on_disk():
    missing = set(EXPECTED) - set(EXPERIMENTS)
    assert not missing, f"recipes checked here but absent from configs/experiment: {sorted(missing)}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_header_names_global_package_and_cites_a_source(name):
    lines = (CONFIGS / "experiment" / f"{name}.yaml").read_text().splitlines()
    assert lines[0].strip() == "# @package _global_", "experiments override several groups, so they live at the root"
    header = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        header.append(line)
    text = "\n".join(header)
    assert len(header) >= 3, "the leading comment must cite the recipe's source"
    assert "et al." in text and any(year in text for year in ("2020", "2021", "2022")), text


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_composes_under_the_typed_schema(name):
    cfg = _compose(f"experiment={name}")
    missing = OmegaConf.missing_keys(cfg)
    assert missing <= {"data.root"}, f"unset mandatory keys: {missing}"
    if missing:
        OmegaConf.update(cfg, "data.root", "/datasets/imagenet")
    obj = OmegaConf.to_object(cfg)  # every key checked against solo.config's dataclasses
    assert isinstance(obj, PretrainConfig)
    kinds = {SimCLRConfig: "simclr", BarlowTwinsConfig: "barlow_twins", CLIPConfig: "clip"}
    assert obj.method.name == kinds[type(obj.method)]
    assert len(obj.augmentation.views) == (1 if obj.method.name == "clip" else 2)
    for view in obj.augmentation.views:
        assert isinstance(view, ViewAugmentation)
        view.validate()
    assert obj.optim.lr_scaling in ("linear", "sqrt", "none")
    assert obj.optim.warmup_epochs < obj.trainer.max_epochs
    assert name.startswith(obj.method.name), "recipe files are named <method>_<dataset>[_<backbone>]"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cited_numbers(name):
    cfg = _compose(f"experiment={name}")
    expected = dict(EXPECTED[name])
    views = expected.pop("views")
    for key, value in expected.items():
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        if isinstance(value, float):
            assert math.isclose(got, value, rel_tol=1e-9), f"{name}: {key} = {got}, expected {value}"
        else:
            assert got == value, f"{name}: {key} = {got!r}, expected {value!r}"
    assert [_view_tuple(v) for v in cfg.augmentation.views] == views
    for v in cfg.augmentation.views:
        assert list(v.crop_scale) == [0.08, 1.0] and v.hflip_prob == 0.5


def test_global_learning_rates_match_the_papers():
    """Scaled as the training loop does it (solo.train.optim.scaled_lr) at the papers' global batches."""
    from solo.train.optim import scaled_lr

    simclr = _compose("experiment=simclr_imagenet").optim
    assert math.isclose(scaled_lr(simclr, 4096), 4.8)  # SimCLR sec. 2.3: 0.3 x 4096/256
    sqrt_rule = _compose("experiment=simclr_imagenet_resnet18").optim
    assert math.isclose(scaled_lr(sqrt_rule, 4096), 4.8)  # 0.075 x sqrt(4096), appendix B.1
    assert math.isclose(scaled_lr(sqrt_rule, 256), 0.075 * math.sqrt(256))
    bt = _compose("experiment=barlow_twins_imagenet").optim
    assert math.isclose(scaled_lr(bt, 2048), 1.6)  # Barlow Twins sec. 2.2: 0.2 x 2048/256
    assert math.isclose(bt.final_lr, scaled_lr(bt, 2048) / 1000)  # decayed by a factor of 1000
    bt18 = _compose("experiment=barlow_twins_imagenet_resnet18").optim
    assert math.isclose(bt18.final_lr, scaled_lr(bt18, 256) / 1000)
    cifar = _compose("experiment=simclr_cifar10").optim
    assert math.isclose(scaled_lr(cifar, 256), 0.4)


def test_command_line_overrides_beat_the_experiment():
    cfg = _compose("experiment=simclr_cifar10", "backbone=resnet50", "method.temperature=0.5", "data.batch_size=64")
    assert cfg.backbone.name == "resnet50" and cfg.backbone.small_stem is True  # the experiment's small_stem still applies
    assert cfg.method.temperature == 0.5 and cfg.data.batch_size == 64


def test_no_experiment_keeps_the_plain_defaults():
    cfg = _compose()
    assert cfg.data.name == "digits" and cfg.method.name == "simclr"


def test_unknown_experiment_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as info:
        _compose("experiment=no_such_recipe")
    message = str(info.value)
    assert "experiment/no_such_recipe" in message
    assert "Available options in 'experiment'" in message
    for name in EXPERIMENTS:
        assert name in message


def test_cli_prints_the_composed_config():
    out = subprocess.run(
        [sys.executable, "main_pretrain.py", "experiment=simclr_cifar10", "--cfg", "job"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    printed = OmegaConf.create(out.stdout)
    assert printed.method.name == "simclr" and printed.method.temperature == 0.2
    assert printed.data.name == "cifar10" and printed.backbone.small_stem is True
    assert printed.optim.lr == 0.4 and printed.trainer.max_epochs == 1000


# ------------------------------------------------------------------ a claim made in barlow_twins_imagenet.yaml


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).double()


def _train(model, optimizer, loss_scale, steps=6):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 5, generator=g, dtype=torch.float64)
        y = torch.randn(16, 3, generator=g, dtype=torch.float64)
        optimizer.zero_grad()
        (loss_scale * (model(x) - y).pow(2).sum()).backward()
        optimizer.step()
    return model


def test_scale_loss_with_scaled_decay_equals_a_separate_bias_lr():
    """method.scale_loss=s with optim.weight_decay=wd*s reproduces, under our LARS, a bias/norm lr of s x the weights'
    lr at weight decay wd (the Barlow Twins paper's 0.0048 vs 0.2 with s = 0.024)."""
    lr, wd, s, eta = 1.6, 1.5e-6, 0.0048 / 0.2, 0.001
    a, b = _tiny_model(), _tiny_model()
    a0 = copy.deepcopy(a.state_dict())
    b.load_state_dict(a0)
    opt_a = LARS(param_groups(a, wd * s), lr=lr, weight_decay=wd * s, eta=eta)
    groups = param_groups(b, wd)
    assert [g["lars_exclude"] for g in groups] == [False, True]
    groups[1]["lr"] = lr * s  # the paper's separate lr for biases and norm parameters
    opt_b = LARS(groups, lr=lr, weight_decay=wd, eta=eta)
    _train(a, opt_a, loss_scale=s)
    _train(b, opt_b, loss_scale=1.0)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-10, atol=1e-12, msg=name)
    # Without the trick (one lr for all, as barlow_twins_imagenet runs by default) the biases/norm params move
    # differently, so the comparison above is not vacuous.
    c = _tiny_model()
    c.load_state_dict(a0)
    _train(c, LARS(param_groups(c, wd), lr=lr, weight_decay=wd, eta=eta), loss_scale=1.0)
    assert not torch.allclose(c[0].bias, b[0].bias)
