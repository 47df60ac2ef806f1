"""A user's own folder, with the files every real folder has: a truncated and an empty JPEG, grey, RGBA, CMYK, tiny
and huge images and a stray text file. Each policy is checked through the commands a user runs (main_pretrain.py,
main_linear.py, solo.zoo): unreadable files named once and skipped alike at any world size, or one error line with
the fix; every readable file made RGB; another folder another run, and moved files resumed when the user says so."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

import solo.zoo
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import CheckpointError
from solo.train.trainer import pretrain
from tests.test_train import REPO, TINY_FILES, compose_cfg, metrics, run, weights

BAD = ("truncated.jpg", "empty.jpg")
ODD = ("grey.jpg", "alpha.png", "cmyk.jpg", "tiny.png", "huge.jpg")


def picture(height: int, width: int, phase: float) -> np.ndarray:
    """A smooth colour pattern with noise, (height, width, 3) uint8: compresses and decodes like a photo."""
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    waves = np.stack([np.sin(6 * x + phase), np.cos(5 * y - phase), np.sin(4 * (x + y) + 2 * phase)], -1)
    noise = np.random.default_rng(int(phase * 10) + height).normal(0, 20, (height, width, 3))
    return np.clip(127 + 100 * waves + noise, 0, 255).astype(np.uint8)


def write_folder(root: Path, dirty: bool = True) -> None:
    """ImageNet layout, 2 classes. Dirty: 16 train files that read as images (9 good, the 2 unreadable, the 5 odd),
    a stray notes.txt; 4 val images either way."""
    for split, count in (("train", 5 if dirty else 8), ("val", 2)):
        for label, name in enumerate(("waves", "ripples")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count - (dirty and split == "train" and label == 1)):
                Image.fromarray(picture(24, 32, 2.0 * label + i / 10)).save(folder / f"{i:03d}.jpg")
    if not dirty:
        return
    odd = root / "train" / "waves"
    good = (odd / "000.jpg").read_bytes()
    (odd / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (odd / "empty.jpg").write_bytes(b"")
    Image.fromarray(picture(20, 20, 1.0)).convert("L").save(odd / "grey.jpg")
    alpha = Image.fromarray(picture(20, 20, 1.0)).convert("RGBA")
    alpha.putalpha(128)
    alpha.save(odd / "alpha.png")
    Image.fromarray(picture(20, 20, 1.0)).convert("CMYK").save(odd / "cmyk.jpg")
    Image.fromarray(picture(15, 20, 1.0)).save(odd / "tiny.png")
    Image.fromarray(picture(2000, 3000, 1.0)).save(odd / "huge.jpg", quality=70)
    (odd / "notes.txt").write_text("where these photos come from\n")


def folder_run(root: Path) -> list[str]:
    return TINY_FILES + [
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=16",
        "data.batch_size=4",
        "trainer.max_steps=2",
    ]


def run_dir_of(overrides: list[str]) -> str:
    """The run directory main_pretrain.py chooses for `overrides` (hydra.run.dir)."""
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        return compose("pretrain", overrides=overrides, return_hydra_config=True).hydra.run.dir


def test_another_folder_is_another_run_and_moved_files_resume_when_said(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    write_folder(a, dirty=False)
    shutil.copytree(a, b)
    name_a, name_b = run_dir_of(folder_run(a)), run_dir_of(folder_run(b))
    assert name_a != name_b and "-imagefolder-A-" in name_a and "-imagefolder-B-" in name_b
    assert run_dir_of(folder_run(Path(f"{a}/../A/"))) == name_a, "the same folder named another way"
    run_a = tmp_path / name_a
    pretrain(compose_cfg(folder_run(a)), run_a)
    id_a = read_checkpoint(run_a / "checkpoints" / "last")["config"]["data"]["id"]
    assert id_a == name_a.split("simclr-")[1].split("-test_resnet")[0]

    # B's files in A's directory (hydra.run.dir pointed there): refused with both identities. Before data.id, the
    # run resumed A's checkpoint on B's files, since data.root may change on resume.
    with pytest.raises(CheckpointError, match=rf"data\.id={id_a}, this run's data\.id=imagefolder-B-.*data\.id={id_a}"):
        pretrain(compose_cfg(folder_run(b)), run_a)

    moved = tmp_path / "elsewhere" / "photos"
    moved.parent.mkdir()
    a.rename(moved)
    assert run_dir_of(folder_run(moved)) != name_a, "moved files are other data until the user says otherwise"
    said = folder_run(moved) + [f"data.id={id_a}", "trainer.max_steps=3"]
    assert run_dir_of(said) == name_a
    pretrain(compose_cfg(said), run_a)
    assert read_checkpoint(run_a / "checkpoints" / "last")["step"] == 3
    steps = [r["step"] for r in metrics(run_a) if "train/loss" in r]
    assert steps == [1, 2, 3], "resumed at step 2, not started again"


def test_the_zoo_transform_gives_rgb_of_every_readable_file(tmp_path):
    write_folder(tmp_path / "photos")
    files = sorted((tmp_path / "photos").rglob("*.*"))
    readable = [f for f in files if f.name not in BAD and f.suffix != ".txt"]
    assert {f.name for f in readable} >= set(ODD)
    transform = solo.zoo.eval_transform("simclr-digits-resnet18half")  # the digits' 16 px, normalised
    for path in readable:
        with Image.open(path) as image:
            assert transform(image).shape == (3, 16, 16), (path.name, image.mode)


def test_the_feature_cache_tells_two_folders_of_one_relative_name_apart(tmp_path, monkeypatch):
    from solo.downstream.offline import evaluate_pretrained
    from tests.test_eval import compose_linear

    monkeypatch.setenv("SOLO_CACHE", str(tmp_path / "cache"))
    linear = ["pretrained=simclr-digits-resnet18half", "random_init=true", "data=imagefolder", "data.root=photos"]
    linear += ["data.image_size=16", "data.num_workers=0", "linear.epochs=1", "plots=false"]
    for where in ("one", "two"):
        write_folder(tmp_path / where / "photos", dirty=False)
        monkeypatch.chdir(tmp_path / where)
        evaluate_pretrained(compose_linear(linear), tmp_path / where / "eval")
    # Keyed by where the files are, not by data.root=photos as written: each folder its own train and val features.
    assert len(list((tmp_path / "cache" / "features").iterdir())) == 4


def command(script: str, overrides: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """`python script overrides` in `run_dir`, its stdout and stderr together."""
    return subprocess.run(
        [sys.executable, script, *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def named_once(out: str) -> None:
    for name in BAD:
        lines = [line for line in out.splitlines() if "skipped an unreadable image" in line and name in line]
        assert len(lines) == 1, (name, out[-3000:])


@pytest.mark.slow  # 5 launches, one of 2 processes: about 1.5 min
def test_a_dirty_folder_trains_and_evaluates_with_skip_and_stops_with_one_line_without(tmp_path):
    photos = tmp_path / "photos"
    write_folder(photos)
    skip = folder_run(photos) + ["data.on_bad_image=skip", "trainer.precision=64", "trainer.max_steps=4"]
    one = run(skip, tmp_path / "one")
    named_once(one)
    named_once((tmp_path / "one" / "main_pretrain.log").read_text())
    # On 2 processes the unreadable files are found while training (data.check_images=0): 4 steps of 4 are an
    # epoch of the 16 train files, so each is met, on either rank, and named once.
    two = run(skip + ["data.check_images=0", "data.batch_size=2"], tmp_path / "two", nproc=2)
    named_once(two)
    assert "images decoded at the start" not in two
    skipped = [[m["data/skipped_images"] for m in metrics(tmp_path / w) if "train/loss" in m] for w in ("one", "two")]
    assert skipped[0] == skipped[1] and sum(skipped[0]) > 0, skipped  # the same samples skipped, step by step
    straight, split = weights(tmp_path / "one"), weights(tmp_path / "two")
    for name in straight:
        torch.testing.assert_close(split[name], straight[name], rtol=0, atol=1e-10, msg=name)

    linear = ["data=imagefolder", f"data.root={photos}", "data.image_size=16", "data.batch_size=4", "plots=false"]
    evaluated = command(
        "main_linear.py", [f"pretrained={tmp_path / 'one'}", *linear, "data.on_bad_image=skip"], tmp_path / "linear"
    )
    assert evaluated.returncode == 0, evaluated.stdout[-3000:]
    named_once(evaluated.stdout)

    for script, overrides, run_dir in (
        ("main_pretrain.py", folder_run(photos), tmp_path / "stopped"),
        ("main_linear.py", [f"pretrained={tmp_path / 'one'}", *linear], tmp_path / "linear_stopped"),
    ):
        done = command(script, overrides, run_dir)
        errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1, (script, done.stdout[-3000:])
        assert any(name in errors[0] for name in BAD) and "data.on_bad_image=skip" in errors[0], errors[0]
        log = (run_dir / f"{Path(script).stem}.log").read_text()
        assert errors[0] in log, (script, log[-2000:])
