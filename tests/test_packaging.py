"""`pip install .` (not editable) from a clean copy gives the three console scripts, each answering --help away from
the checkout, and the installed package finds its configs and trains."""

import os
import subprocess
import sys

import pytest

from tests.test_train import REPO


@pytest.mark.slow
@pytest.mark.one_process
def test_pip_install_gives_the_console_scripts(tmp_path):
    clone, venv, elsewhere = tmp_path / "clone", tmp_path / "venv", tmp_path / "elsewhere"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    # The dependencies (torch, ...) come from this interpreter's site-packages; solo itself from the clone, installed.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--no-deps", str(clone)], check=True)
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    for script, expected in [
        ("solo-pretrain", "method: "),
        ("solo-linear", "pretrained"),
        ("solo-check", "usage: solo-check"),
    ]:
        result = subprocess.run(
            [venv / "bin" / script, "--help"], cwd=elsewhere, capture_output=True, text=True, env=env
        )
        assert result.returncode == 0 and expected in result.stdout, (
            f"{script} --help:\n{result.stdout}\n{result.stderr}"
        )
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import solo; print(solo.__file__)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
    )
    assert str(venv) in where.stdout, where.stdout  # the installed copy, not the checkout
    short = [
        "trainer.max_steps=1",
        "data.batch_size=16",
        "backbone=resnet18_half",
        "trainer.plots=false",
        "trainer.progress_bar=false",
    ]
    result = subprocess.run(
        [venv / "bin" / "solo-pretrain", *short], cwd=elsewhere, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "outputs" / "simclr-digits-resnet18-b16-seed0" / "main_pretrain.log").exists()
