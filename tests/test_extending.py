"""Extending solo from a package of one's own: a method, a dataset and a backbone, each one module plus one YAML,
trained together for 2 steps and listed by `main_pretrain.py --help`."""

import subprocess
import sys
import textwrap

import pytest
from hydra import compose, initialize_config_dir

from solo.config import import_modules, validate_pretrain
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.train.trainer import pretrain
from tests.test_train import REPO

MODULES = {
    "user_cosine.py": '''
        from dataclasses import dataclass

        import torch.nn.functional as F

        from solo.methods import register_method
        from solo.methods.base import TwoViewMethod, mlp
        from solo.schema import AT_LEAST_ONE, ruled


        @dataclass
        class UserCosineConfig:
            name: str = "user_cosine"
            out_dim: int = ruled(16, AT_LEAST_ONE)


        @register_method("user_cosine", schema=UserCosineConfig)
        class UserCosine(TwoViewMethod):
            """Negative cosine similarity of the two views' projections."""

            def __init__(self, backbone, feature_dim, cfg):
                super().__init__(backbone, feature_dim)
                self.projector = mlp([feature_dim, cfg.out_dim, cfg.out_dim])

            def loss(self, z1, z2):
                return -F.cosine_similarity(z1, z2).mean()
    ''',
    "user_squares.py": '''
        from dataclasses import dataclass

        import numpy as np
        from PIL import Image

        from solo.data import DataConfig, register_dataset


        @dataclass
        class UserSquaresConfig(DataConfig):
            num_samples: int = 48


        class Squares:
            """A bright square in one of four corners: the corner is the class."""

            classes = ["top-left", "top-right", "bottom-left", "bottom-right"]

            def __init__(self, n, size, split):
                self.n, self.size, self.offset = n, size, 0 if split == "train" else 1000

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                label, half = i % 4, self.size // 2
                pixels = np.random.default_rng(self.offset + i).integers(0, 60, (self.size, self.size, 3), dtype=np.uint8)
                rows, cols = (slice(0, half) if label < 2 else slice(half, None)), (slice(0, half) if label % 2 == 0 else slice(half, None))
                pixels[rows, cols] = 230
                return Image.fromarray(pixels), label


        @register_dataset("user_squares", schema=UserSquaresConfig, stats=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))
        def user_squares(d, split, seed, pairs):
            return Squares(d.num_samples, d.image_size, split)
    ''',
    "user_convnet.py": """
        from dataclasses import dataclass

        from torch import nn

        from solo.backbones import BackboneConfig, register_backbone
        from solo.schema import AT_LEAST_ONE, ruled


        @dataclass
        class UserConvNetConfig(BackboneConfig):
            width: int = ruled(8, AT_LEAST_ONE)


        @register_backbone("user_convnet", schema=UserConvNetConfig)
        def user_convnet(cfg):
            net = nn.Sequential(nn.Conv2d(3, cfg.width, 3, padding=1), nn.BatchNorm2d(cfg.width), nn.ReLU(),
                                nn.AdaptiveAvgPool2d(1), nn.Flatten())
            return net, cfg.width
    """,
}
YAMLS = {
    "method/user_cosine.yaml": "name: user_cosine\nout_dim: 8\n",
    "data/user_squares.yaml": "name: user_squares\nimage_size: 8\nbatch_size: 8\nnum_samples: 32\nnum_workers: 0\n",
    "backbone/user_convnet.yaml": "name: user_convnet\nwidth: 6\n",
}


@pytest.fixture(scope="module")
def user_package(tmp_path_factory):
    """userpkg/ with the three modules, and userpkg/configs/ with their YAMLs, on sys.path."""
    root = tmp_path_factory.mktemp("user")
    package = root / "userpkg"
    (package / "configs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, source in MODULES.items():
        (package / name).write_text(textwrap.dedent(source))
    for name, text in YAMLS.items():
        (package / "configs" / name).parent.mkdir(parents=True, exist_ok=True)
        (package / "configs" / name).write_text(text)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def _overrides(root) -> list[str]:
    return [
        "imports=[userpkg.user_cosine,userpkg.user_squares,userpkg.user_convnet]",
        f"hydra.searchpath=[file://{root / 'userpkg' / 'configs'}]",
        "method=user_cosine",
        "data=user_squares",
        "backbone=user_convnet",
    ]


def test_a_users_method_dataset_and_backbone_train_together(user_package, tmp_path):
    overrides = _overrides(user_package) + ["trainer.max_steps=2", "trainer.progress_bar=false", "trainer.plots=false"]
    import_modules(["userpkg.user_cosine", "userpkg.user_squares", "userpkg.user_convnet"])
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        cfg = validate_pretrain(compose("pretrain", overrides=overrides))
    assert (cfg.method.out_dim, cfg.data.num_samples, cfg.backbone.width) == (8, 32, 6)  # each YAML typed by its schema
    metrics = pretrain(cfg, tmp_path)
    assert metrics["step"] == 2 and 0.0 <= metrics["val/acc1"] <= 1.0
    state = read_checkpoint(tmp_path / "checkpoints" / "last")["model"]
    assert state["method.backbone.0.weight"].shape == (6, 3, 3, 3)  # the user's backbone, at the YAML's width


def test_fsdp_refuses_a_backbone_it_cannot_shard_block_by_block(user_package, tmp_path):
    """user_convnet is one nn.Sequential with no blocks: the error names it and the fix, on one process already."""
    overrides = _overrides(user_package) + ["trainer.strategy=fsdp", "trainer.max_steps=1"]
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        cfg = validate_pretrain(compose("pretrain", overrides=overrides))
    with pytest.raises(ConfigError, match="trainer.strategy=fsdp shards a backbone block by block, and Sequential"):
        pretrain(cfg, tmp_path)


@pytest.mark.slow  # main_pretrain.py --help in a subprocess: about 10 s
@pytest.mark.one_process
def test_help_lists_what_a_users_package_registers(user_package):
    env = {"PYTHONPATH": f"{user_package}:{REPO}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "main_pretrain.py", *_overrides(user_package)[:2], "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    registered = out.stdout[out.stdout.index("Registered") :]
    assert "user_cosine" in registered.split("method:")[1].splitlines()[0]
    assert "user_squares" in registered.split("data.name:")[1].splitlines()[0]
    assert "user_convnet" in registered.split("backbone.name:")[1].splitlines()[0]
    groups = out.stdout[: out.stdout.index("== Config ==")]  # the YAML options, from the searchpath
    assert all(name in groups for name in ("user_cosine", "user_squares", "user_convnet"))
