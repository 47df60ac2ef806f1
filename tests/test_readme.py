"""The README's quick start, then each command it gives, in order, in a fresh directory (short versions)."""

import os
import subprocess
import sys

import pytest

from tests.test_train import REPO

README = (REPO / "README.md").read_text()
SHORT_PRETRAIN = ["backbone=resnet18_half", "trainer.max_epochs=1", "trainer.plots=false", "trainer.progress_bar=false"]
# (command as the README writes it, what the short version appends)
COMMANDS = [
    ("torchrun --nproc_per_node=2 main_pretrain.py", SHORT_PRETRAIN),
    ("python main_pretrain.py", SHORT_PRETRAIN),
    ("torchrun --nproc_per_node=2 main_pretrain.py method=barlow_twins", SHORT_PRETRAIN),
    (
        "python main_linear.py pretrained=outputs/simclr-digits-resnet18-b128-seed0",
        ["linear.epochs=2", "feature_cache=false"],
    ),
    (
        "python main_linear.py pretrained=simclr-digits-resnet18half",
        ["linear.epochs=2", "feature_cache=false", "plots=false"],
    ),
    ("python -m solo.losses.check", ["--world-sizes", "2"]),
    ("torchrun --nproc_per_node=2 main_pretrain.py method=clip", SHORT_PRETRAIN),
]


@pytest.mark.slow
def test_readme_commands_in_order(tmp_path):
    for command, short in COMMANDS:
        assert command in README, f"the README no longer shows {command!r}: update this test"
        words = command.split()
        program = (
            [sys.executable, "-m", "torch.distributed.run", *words[1:2], "--standalone"]
            if words[0] == "torchrun"
            else [sys.executable]
        )
        rest = words[2:] if words[0] == "torchrun" else words[1:]
        if rest[0].endswith(".py"):
            rest[0] = str(REPO / rest[0])
        result = subprocess.run(
            program + rest + short,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        )
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "outputs" / "simclr-digits-resnet18-b64-seed0" / "checkpoints" / "last.pt").exists()
