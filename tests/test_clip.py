"""CLIP end to end: exact distributed step for both towers and the logit scale, its metrics, image-text CSV input."""

import csv

import pytest
from PIL import Image

from solo.errors import DataError
from solo.train.trainer import pretrain
from tests.test_train import compose_cfg, metrics

TINY_CLIP = [
    "method=clip",
    "augmentation=clip",
    "backbone.name=test_resnet",
    "method.embed_dim=16",
    "method.text.width=16",
    "method.text.depth=1",
    "method.text.heads=2",
    "data.num_workers=0",
    "optim.warmup_epochs=0",
    "trainer.progress_bar=false",
    "trainer.log_every_steps=1",
]


# CLIP's exact step: tests/test_accumulate.py (the quick suite), tests/test_strategies.py (DDP and FSDP, uneven
# and empty ranks).


@pytest.mark.slow
@pytest.mark.one_process
def test_clip_on_digits_logs_zero_shot_retrieval_and_its_logit_scale(tmp_path):
    """A smoke run of `method=clip` as it is (3 steps): what it learns is a measurement, the zoo's CLIP entry
    (`python scripts/build_zoo.py --only clip-digits-resnet18half`: zero-shot and linear accuracy)."""
    final = pretrain(compose_cfg(["method=clip", "trainer.max_steps=3", "trainer.progress_bar=false"]), tmp_path)
    assert 0 <= final["val/zeroshot_acc1"] <= 1
    rows = metrics(tmp_path)
    assert {"val/zeroshot_acc5", "val/i2t_recall1", "val/t2i_recall5", "val/acc1"} <= rows[-1].keys()
    assert any("train/logit_scale" in r for r in rows)


def _write_pairs(folder, name, rows, columns=("image", "caption", "label")):
    with open(folder / name, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


@pytest.fixture
def caption_folder(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    rows = []
    for i in range(24):
        colour = "red" if i % 2 else "blue"
        Image.new("RGB", (20, 20), (255, 0, 0) if i % 2 else (0, 0, 255)).save(images / f"{i}.png")
        rows.append([f"images/{i}.png", f"a {colour} square number {i}", i % 2])
    return tmp_path, rows


def test_clip_trains_from_a_caption_csv(caption_folder):
    root, rows = caption_folder
    _write_pairs(root, "pairs_train.csv", rows[:16])
    _write_pairs(root, "pairs_val.csv", rows[16:])
    overrides = TINY_CLIP + [
        "data=csv",
        f"data.root={root}",
        f"data.file='{root}/pairs_{{split}}.csv'",
        "data.image_size=16",
    ]
    final = pretrain(compose_cfg(overrides + ["data.batch_size=8", "trainer.max_steps=2"]), root / "run")
    assert {"val/zeroshot_acc1", "val/i2t_recall1", "val/acc1"} <= final.keys()


@pytest.mark.parametrize(
    "mutate, error, message",
    [
        (
            lambda rows: rows.__setitem__(3, ["images/missing.png", "a caption", 0]),
            DataError,
            r"1 of the \d+ images checked cannot be read: .*missing.png",
        ),
        (lambda rows: rows.__setitem__(5, ["images/5.png", "   ", 1]), ValueError, "row 6"),
    ],
)
def test_bad_caption_csv_is_a_clear_error(caption_folder, mutate, error, message):
    root, rows = caption_folder
    mutate(rows)
    _write_pairs(root, "pairs_train.csv", rows)
    overrides = TINY_CLIP + [
        "data=csv",
        f"data.root={root}",
        f"data.file='{root}/pairs_{{split}}.csv'",
        "data.image_size=16",
    ]
    with pytest.raises(error, match=message):
        pretrain(compose_cfg(overrides + ["data.batch_size=8", "trainer.max_steps=1"]), root / "run")


def test_caption_csv_with_wrong_columns(caption_folder):
    root, rows = caption_folder
    _write_pairs(root, "pairs_train.csv", [r[:2] for r in rows], columns=("path", "text"))
    overrides = TINY_CLIP + ["data=csv", f"data.root={root}", f"data.file='{root}/pairs_{{split}}.csv'"]
    with pytest.raises(ValueError, match="path"):
        pretrain(compose_cfg(overrides + ["data.batch_size=8", "trainer.max_steps=1"]), root / "run")


def test_long_captions_are_truncated_and_reported_once(caption_folder):
    root, rows = caption_folder
    rows = [[path, caption + " " + "very " * 20 + "long", label] for path, caption, label in rows]
    _write_pairs(root, "pairs_train.csv", rows)
    overrides = TINY_CLIP + [
        "data=csv",
        f"data.root={root}",
        f"data.file='{root}/pairs_{{split}}.csv'",
        "data.image_size=16",
    ]
    with pytest.warns(UserWarning, match="truncated") as record:
        pretrain(compose_cfg(overrides + ["data.batch_size=8", "trainer.max_steps=1"]), root / "run")
    assert len([w for w in record if "truncated" in str(w.message)]) == 1


def test_missing_caption_images_are_skipped_and_counted_until_too_many(caption_folder):
    """data=csv looks at no image file at start: a missing one is skipped and counted (data.on_bad_image=skip);
    when most images of a logging window are unreadable, the run stops with an error naming the data's paths."""
    root, rows = caption_folder
    overrides = TINY_CLIP + [
        "data=csv",
        f"data.root={root}",
        f"data.file='{root}/pairs_{{split}}.csv'",
        "data.image_size=16",
        "data.on_bad_image=skip",
        "data.batch_size=8",
        "trainer.max_steps=2",
        "trainer.log_every_steps=2",
    ]
    few = [[f"images/gone_{i}.png", *r[1:]] if i in (3, 10) else r for i, r in enumerate(rows[:16])]
    _write_pairs(root, "pairs_train.csv", few)
    pretrain(compose_cfg(overrides), root / "few")
    assert sum(m.get("data/skipped_images", 0) for m in metrics(root / "few")) >= 1
    _write_pairs(
        root, "pairs_train.csv", [[f"images/gone_{i}.png", *r[1:]] if i % 4 else r for i, r in enumerate(rows[:16])]
    )
    with pytest.raises(DataError, match=r"of the last 16 images read could not be read .*data.root, data.path"):
        pretrain(compose_cfg(overrides), root / "many")
