"""Every scalar key of the default config given wrong values (a word, a negative, zero; a word is also an unknown
choice): each run either trains or stops with a short error that names the key, never with a traceback."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from solo.errors import SoloError
from solo.train.trainer import pretrain
from tests.test_train import REPO, compose_cfg

WRONG = ("abc", "-3", "0")
# Small and quick, on the default data; the key under test comes after these, so it wins.
QUICK = [
    "backbone.name=test_resnet",
    "method.proj_hidden_dim=32",
    "method.proj_output_dim=16",
    "data.batch_size=16",
    "data.num_workers=0",
    "data.check_images=10",
    "trainer.max_steps=1",
    "trainer.progress_bar=false",
    "trainer.plots=false",
]


def scalar_keys(node, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items_ex(resolve=False) if isinstance(node, DictConfig) else []:
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, DictConfig):
            keys += scalar_keys(value, full)
        elif not isinstance(value, ListConfig):
            keys.append(full)
    return keys


def _default_keys() -> list[str]:
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        return scalar_keys(compose("pretrain"))


def names_the_key(message: str, key: str) -> bool:
    group, _, leaf = key.rpartition(".")
    return key in message or (leaf == "name" and f"{group}=" in message)  # method=..., data.name=...


@pytest.mark.slow
@pytest.mark.parametrize("key", _default_keys())
@pytest.mark.one_process
def test_wrong_values_train_or_name_the_key(key, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(
        huggingface_hub.constants, "HF_HUB_OFFLINE", True
    )  # backbone.pretrained: no retries on a network that is not there
    for i, value in enumerate(WRONG):
        try:
            pretrain(compose_cfg(QUICK + [f"{key}={value}"]), tmp_path / f"run{i}")
        except (SoloError, OmegaConfBaseException, HydraException) as e:  # what the entry point prints as one message
            message = str(e)
            assert names_the_key(message, key) and len(message.splitlines()) <= 6, f"{key}={value}: {message}"


def test_the_sweep_covers_every_group():
    keys = _default_keys()
    assert {k.split(".")[0] for k in keys} == {
        "backbone",
        "method",
        "data",
        "augmentation",
        "optim",
        "logger",
        "trainer",
    }
    assert "trainer.seed" in keys and "data.augment_on" in keys and "method.temperature" in keys


def test_a_negative_seed_is_refused_before_any_work():
    with pytest.raises(SoloError, match=r"trainer.seed=-3: must be >= 0"):
        compose_cfg(QUICK + ["trainer.seed=-3"])


def test_max_steps_zero_is_an_error_not_no_limit():
    for value in ("0", "-3"):
        with pytest.raises(SoloError, match=rf"trainer.max_steps={value}: must be >= 1"):
            compose_cfg(QUICK + [f"trainer.max_steps={value}"])


def test_a_key_of_another_dataset_is_an_error_that_names_it():
    for key in ("data.root", "data.file", "data.shards", "data.val_shards", "data.cache_dir"):
        with pytest.raises(HydraException, match=rf"Could not override '{key}'"):
            compose_cfg([f"{key}=/somewhere"])
    with pytest.raises(SoloError, match=r"Key 'root' not in 'DataConfig' \(full key data.root\)"):
        compose_cfg(["+data.root=/somewhere"])
    assert OmegaConf.select(compose_cfg(["data=imagefolder", "data.root=/somewhere"]), "data.root") == "/somewhere"


# The masked-image methods, whose keys meet the ViT's patch grid, their own transformers' widths and their masks.
MASKED = ("mae", "simmim", "aim", "msn", "ijepa", "capi", "dinov2", "franca")
TINY_VIT = [
    "backbone=vit_tiny",
    "+backbone.kwargs.depth=1",
    "+backbone.kwargs.embed_dim=48",
    "data.batch_size=8",
    "data.num_workers=0",
    "trainer.max_steps=1",
    "trainer.knn_k=0",
    "trainer.progress_bar=false",
    "trainer.plots=false",
]


def _method_keys(method: str) -> list[str]:
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        return [f"method.{k}" for k in scalar_keys(compose("pretrain", overrides=[f"method={method}"]).method)]


@pytest.mark.slow
@pytest.mark.parametrize(  # CI sweeps a random-patch and a block-masked method; the others: `pytest -m exhaustive`
    "method", [m if m in ("mae", "ijepa") else pytest.param(m, marks=pytest.mark.exhaustive) for m in MASKED]
)
@pytest.mark.one_process
def test_a_masked_methods_keys_at_their_extremes_train_or_name_the_key(method, tmp_path):
    """Each scalar key of the method at 0, 1 and 100 on a 4 x 4 patch grid: a ratio of all or nothing, a block larger
    than the grid, more heads than the width holds. Each run trains or stops with a short error naming the key."""
    for key in _method_keys(method):
        for i, value in enumerate(("0", "1", "100")):
            try:
                pretrain(compose_cfg(TINY_VIT + [f"method={method}", f"{key}={value}"]), tmp_path / f"{key}-{i}")
            except (SoloError, OmegaConfBaseException, HydraException) as e:
                message = str(e)
                assert names_the_key(message, key) and len(message.splitlines()) <= 6, f"{key}={value}: {message}"
