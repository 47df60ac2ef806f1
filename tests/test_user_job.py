"""The user's own job: a folder of their RGB photos at 96 px (here generated: shapes on textured, coloured grounds, in
classes), trained with the defaults as an image folder and as a Parquet dataset (solo.data.make_shards), on 2
processes under DDP and FSDP, evaluated on a validation split that does not divide over the ranks, and killed and
resumed bit-identically. No override but the data's path, the number of steps and a batch size that fits a CPU."""

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image, ImageDraw

from solo.distributed.checkpoint import read_checkpoint
from tests.test_train import REPO, kill_processes_mentioning, launch, many_runs, metrics, weights

SHAPES = ("circle", "square", "triangle", "cross")
SIZE = 96
TRAIN_PER_CLASS, VAL = (
    80,
    45,
)  # 320 train images; 45 val images: 23 on rank 0, 22 on rank 1 (and a padding row), in batches of 4


def photo(shape: str, rng: np.random.Generator) -> Image.Image:
    """A shape of a random colour, size and place on a ground of noise, stripes or a gradient of another colour."""
    ground = rng.integers(0, 256, 3)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    texture = rng.integers(3)
    if texture == 0:
        pattern = rng.normal(0, 25, (SIZE, SIZE, 1))
    elif texture == 1:
        angle, period = rng.uniform(0, np.pi), rng.uniform(6, 20)
        pattern = 30 * np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)[..., None]
    else:
        pattern = (xx / SIZE * 60 - 30)[..., None]
    image = Image.fromarray(np.clip(ground + pattern, 0, 255).astype(np.uint8))
    draw, colour = ImageDraw.Draw(image), tuple(int(c) for c in rng.integers(0, 256, 3))
    r = int(rng.integers(14, 34))
    cx, cy = (int(c) for c in rng.integers(r, SIZE - r, 2))
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    else:
        draw.rectangle([cx - r, cy - r // 3, cx + r, cy + r // 3], fill=colour)
        draw.rectangle([cx - r // 3, cy - r, cx + r // 3, cy + r], fill=colour)
    return image


def write_photos(root) -> None:
    rng = np.random.default_rng(0)
    counts = {
        "train": [TRAIN_PER_CLASS] * len(SHAPES),
        "val": [VAL // len(SHAPES) + (i < VAL % len(SHAPES)) for i in range(len(SHAPES))],
    }
    for split, per_class in counts.items():
        for shape, count in zip(SHAPES, per_class):
            folder = root / split / shape
            folder.mkdir(parents=True)
            for i in range(count):
                photo(shape, rng).save(folder / f"{i:03d}.jpg", quality=90)


def to_parquet(photos, out) -> None:
    for split in ("train", "val"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "solo.data.make_shards",
                "imagefolder",
                str(photos / split),
                str(out),
                "--format",
                "parquet",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )


@pytest.mark.slow  # one 2-process launch of two runs, then one killed and resumed: about 2 min
def test_photos_train_with_the_defaults_under_ddp_and_fsdp_and_resume_bit_identical(tmp_path):
    photos, parquet = tmp_path / "photos", tmp_path / "parquet"
    write_photos(photos)
    to_parquet(photos, parquet)
    assert sum(1 for _ in photos.rglob("*.jpg")) >= 300
    folder = ["data=imagefolder", f"data.root={photos}", "data.batch_size=4", "trainer.max_steps=2"]
    hf = ["data=huggingface", f"data.path={parquet}", "data.batch_size=4", "trainer.max_steps=4"]
    runs = {tmp_path / "folder-ddp": folder, tmp_path / "parquet-fsdp": [*hf, "trainer.strategy=fsdp"]}
    many_runs(runs)
    for run_dir in runs:
        config = OmegaConf.load(run_dir / "config.yaml")
        assert config.backbone.small_stem is False and config.augmentation.name == "simclr"  # chosen for 96 px photos
        assert config.data.image_size == 224  # the data's default, resized from the 96 px files
        last = metrics(run_dir)[-1]
        assert 0 <= last["val/acc1"] <= 1 and last["val/acc5"] == 1.0  # 4 classes: all within the top 5

    killed = tmp_path / "killed"
    proc = launch(
        [*hf, "trainer.strategy=fsdp", "trainer.checkpoint_every_steps=1"],
        killed,
        nproc=2,
        torchrun=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 180
    while not (killed / "checkpoints" / "step-000000002").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    kill_processes_mentioning(str(killed))
    proc.wait()
    assert 0 < read_checkpoint(killed / "checkpoints" / "last")["step"] < 4, "the kill must land mid-run"
    many_runs({killed: [*hf, "trainer.strategy=fsdp", "trainer.checkpoint_every_steps=1"]})
    straight, resumed = weights(tmp_path / "parquet-fsdp"), weights(killed)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
