"""Tests for solo.data.sources.pairs and solo.data.views.image_text: caption pairs, seeded image-text samples, file validation."""

import csv
import json
import random
import warnings

import numpy as np
import pytest
import torch
from omegaconf.errors import MissingMandatoryValue
from PIL import Image

from solo.data import (
    ImageReadError,
    ViewAugmentation,
    build_dataset,
    build_eval_transform,
    build_view_transform,
    dataset_stats,
)
from solo.data.sampling.seeding import sample_seed
from solo.data.sources.pairs import DIGIT_TEMPLATES, CsvPairs, DigitsPairs, digit_caption
from solo.data.views.image_text import ImageTextDataset, ZeroShotEvalDataset
from solo.text.tokenizer import ByteTokenizer
from tests.test_data import assert_global_rng_untouched

SIZE = 16
CONTEXT = 48
MEAN, STD = dataset_stats("digits")


@pytest.fixture(scope="module")
def digits_train():
    return DigitsPairs("train", SIZE)


def _train_dataset(pairs, seed=3):
    transform = build_view_transform(ViewAugmentation(blur_prob=0.5), SIZE, MEAN, STD)
    return ImageTextDataset(pairs, transform, ByteTokenizer(CONTEXT), seed=seed)


def _caption(ds, sample):
    return ByteTokenizer.decode(sample["text"])


def _write_png(path, colour, size=6):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), colour, dtype=np.uint8), mode="RGB").save(path)


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _write_jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


# ---------------------------------------------------------------------------- digits


def test_digit_caption_uses_word_and_numeral():
    assert len(DIGIT_TEMPLATES) == 8
    assert any("{word}" in t for t in DIGIT_TEMPLATES) and any("{numeral}" in t for t in DIGIT_TEMPLATES)
    assert digit_caption("a photo of the number {word}.", 7) == "a photo of the number seven."
    assert digit_caption("a handwritten {numeral}.", 7) == "a handwritten 7."
    with pytest.raises(ValueError):
        digit_caption("{word}", 10)


def test_digits_pairs_sizes_and_captions(digits_train):
    val = DigitsPairs("val", SIZE)
    assert len(digits_train) == 1437 and len(val) == 360
    assert digits_train.classes[7] == "seven" and len(digits_train.classes) == 10
    index = next(i for i in range(len(val)) if val.label(i) == 7)
    options = val.caption_options(index)
    assert len(options) == len(DIGIT_TEMPLATES)
    assert all(("seven" in c) or ("7" in c) for c in options)
    assert any("seven" in c for c in options) and any("7" in c for c in options)
    other_words = [w for w in val.classes if w != "seven"]
    assert not any(w in c for c in options for w in other_words)
    image = val.image(index)
    assert image.mode == "RGB" and image.size == (SIZE, SIZE)
    assert val[index][1] == 7  # pairs also act as a base dataset


# --------------------------------------------------------------- ImageTextDataset


def test_same_key_same_sample_regardless_of_order(digits_train):
    ds = _train_dataset(digits_train)
    first = ds[(2, 5)]
    for i in range(6):
        ds[(2, i)]
    torch.manual_seed(99)
    random.seed(99)
    again = _train_dataset(digits_train)[(2, 5)]
    assert torch.equal(first["image"], again["image"])
    assert torch.equal(first["text"], again["text"])
    assert first["text"].dtype == torch.long and first["text"].shape == (CONTEXT,)
    assert first["image"].shape == (3, SIZE, SIZE)
    assert first["index"] == 5 and first["label"] == digits_train.label(5)
    assert _caption(ds, first) in digits_train.caption_options(5)
    # The image matches a hand-seeded reference (view 0 of the sample seed).
    torch.manual_seed(sample_seed(3, 2, 5, 0))
    random.seed(sample_seed(3, 2, 5, 0))
    assert torch.equal(first["image"], ds.transform(digits_train.image(5)))
    assert not torch.equal(first["image"], _train_dataset(digits_train, seed=4)[(2, 5)]["image"])


def test_epochs_change_captions(digits_train):
    ds = _train_dataset(digits_train)
    e0 = [_caption(ds, ds[(0, i)]) for i in range(10)]
    e1 = [_caption(ds, ds[(1, i)]) for i in range(10)]
    assert e0 != e1
    assert [_caption(ds, ds[(0, i)]) for i in range(10)] == e0


def test_reading_leaves_global_rng_unchanged(digits_train):
    ds = _train_dataset(digits_train)
    eval_transform = build_eval_transform(SIZE, MEAN, STD, resize=False)
    ev = ZeroShotEvalDataset(digits_train, eval_transform, ByteTokenizer(CONTEXT))
    assert_global_rng_untouched(lambda: (ds[(0, 1)], ev[1]))


def test_dataloader_workers_do_not_change_samples(digits_train):
    ds = _train_dataset(digits_train)
    keys = [(1, i) for i in (7, 0, 3, 11, 5, 2)]
    got = {}
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=keys, num_workers=workers)
        batches = list(loader)
        got[workers] = {k: torch.cat([b[k] for b in batches]) for k in ("image", "text", "label", "index")}
    for k in ("image", "text", "label", "index"):
        assert torch.equal(got[0][k], got[2][k])
    assert got[0]["index"].tolist() == [i for _, i in keys]


def test_rejects_plain_index(digits_train):
    with pytest.raises(TypeError, match=r"\(epoch, index\)"):
        _train_dataset(digits_train)[3]


def test_no_truncation_warning_for_short_captions(digits_train):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = _train_dataset(digits_train)
    assert ds.truncated_captions == 0


def test_truncation_warns_once_and_keeps_prefix(tmp_path):
    for i in range(4):
        _write_png(tmp_path / f"{i}.png", 40 * i)
    long_a = "a very long caption that goes on " * 3
    long_b = "another long caption, also well past the context " * 2
    rows = [["0.png", "short"], ["1.png", long_a], ["2.png", long_b], ["3.png", long_a]]
    pairs = CsvPairs(_write_csv(tmp_path / "c.csv", ["image", "caption"], rows), tmp_path)
    with pytest.warns(UserWarning) as record:
        transform = build_eval_transform(SIZE, MEAN, STD, resize=True)
        ds = ImageTextDataset(pairs, transform, ByteTokenizer(24), seed=0)
    assert len(record) == 1
    message = str(record[0].message)
    assert "2 of 3" in message and "truncated" in message
    assert ds.truncated_captions == 2  # distinct long captions
    tokens = ds[(0, 1)]["text"]
    assert ByteTokenizer.decode(tokens) == long_a.strip()[:22]
    assert ByteTokenizer.decode(ds[(0, 0)]["text"]) == "short"


# ---------------------------------------------------------------------- zero-shot


def test_zero_shot_eval_dataset_is_deterministic(digits_train):
    val = DigitsPairs("val", SIZE)
    ev = ZeroShotEvalDataset(val, build_eval_transform(SIZE, MEAN, STD, resize=False), ByteTokenizer(CONTEXT))
    a, b = ev[4], ev[4]
    assert torch.equal(a["image"], b["image"]) and torch.equal(a["text"], b["text"])
    assert ByteTokenizer.decode(a["text"]) == val.caption_options(4)[0]
    assert a["label"] == val.label(4) and a["index"] == 4
    assert len(ev) == 360 and ev.classes == val.classes


# ------------------------------------------------------------------- csv / jsonl


def _image_tree(tmp_path, n=3):
    for i in range(n):
        _write_png(tmp_path / "imgs" / f"{i}.png", 50 * i)
    return [f"imgs/{i}.png" for i in range(n)]


def test_csv_round_trip_with_labels(tmp_path):
    paths = _image_tree(tmp_path)
    absolute = str(tmp_path / "imgs" / "2.png")
    rows = [[paths[0], "a red square", 0], [paths[1], "  a blue square ", 2], [absolute, "a green one", 1]]
    file = _write_csv(tmp_path / "caps.csv", ["image", "caption", "label"], rows)
    pairs = CsvPairs(file, str(tmp_path))
    assert len(pairs) == 3
    assert pairs.caption_options(1) == ["a blue square"]
    assert [pairs.label(i) for i in range(3)] == [0, 2, 1]
    assert pairs.classes == ["0", "1", "2"]
    img = pairs.image(1)
    assert img.mode == "RGB" and np.asarray(img)[0, 0].tolist() == [50, 50, 50]
    # root=None: paths are relative to the caption file's folder.
    assert CsvPairs(file).paths == pairs.paths


def test_jsonl_round_trip_partial_labels(tmp_path):
    paths = _image_tree(tmp_path)
    objs = [
        {"image": paths[0], "caption": "zero", "label": 3},
        {"image": paths[1], "caption": "one"},
        {"image": paths[2], "caption": "two", "label": None},
    ]
    file = _write_jsonl(tmp_path / "caps.jsonl", objs)
    with open(file, "a") as f:
        f.write("\n")  # trailing blank line is fine
    pairs = CsvPairs(file, tmp_path)
    assert len(pairs) == 3
    assert [pairs.label(i) for i in range(3)] == [3, -1, -1]
    assert pairs.classes is None
    assert pairs.caption_options(2) == ["two"]
    assert np.asarray(pairs.image(2))[0, 0].tolist() == [100, 100, 100]


def test_csv_wrong_columns_lists_found(tmp_path):
    paths = _image_tree(tmp_path)
    file = _write_csv(tmp_path / "c.csv", ["img", "caption"], [[paths[0], "x"]])
    with pytest.raises(ValueError, match=r"found \['img', 'caption'\]") as info:
        CsvPairs(file, tmp_path)
    assert "image" in str(info.value) and str(file) in str(info.value)
    file = _write_jsonl(tmp_path / "c.jsonl", [{"image": paths[0], "caption": "x", "labels": 1}])
    with pytest.raises(ValueError, match="labels"):
        CsvPairs(file, tmp_path)


def test_csv_empty_caption_names_row(tmp_path):
    paths = _image_tree(tmp_path)
    rows = [[paths[0], "fine"], [paths[1], "fine"], [paths[2], "   "]]
    file = _write_csv(tmp_path / "c.csv", ["image", "caption"], rows)
    with pytest.raises(ValueError, match=r"row 3\b.*empty caption"):
        CsvPairs(file, tmp_path)


def test_csv_bad_label_names_row_and_value(tmp_path):
    paths = _image_tree(tmp_path)
    rows = [[paths[0], "a", 1], [paths[1], "b", "cat"]]
    file = _write_csv(tmp_path / "c.csv", ["image", "caption", "label"], rows)
    with pytest.raises(ValueError, match=r"row 2\b.*'cat'"):
        CsvPairs(file, tmp_path)


def test_csv_missing_images_are_found_when_read_not_at_start(tmp_path):
    """No stat call per row at start (a million rows would hold it back): a missing file is an unreadable image,
    named with its row when read, and the start-up check of the first images lists each that fails."""
    from solo.data.decode import unreadable

    paths = _image_tree(tmp_path, n=1)
    rows = [[paths[0], "ok"]] + [[f"imgs/missing_{i}.png", "gone"] for i in range(7)]
    pairs = CsvPairs(_write_csv(tmp_path / "c.csv", ["image", "caption"], rows), tmp_path)
    assert len(pairs) == 8
    with pytest.raises(ImageReadError, match=r"missing_0\.png \(row 2 of"):
        pairs.image(1)
    found = unreadable(pairs.image, range(8), threads=2)
    assert [i for i, _ in found] == list(range(1, 8)) and "missing_0.png (row 2 of" in found[0][1]


def test_corrupt_image_named_when_read(tmp_path):
    paths = _image_tree(tmp_path, n=2)
    (tmp_path / "imgs" / "bad.png").write_bytes(b"not a png at all")
    rows = [[paths[0], "ok"], ["imgs/bad.png", "broken"]]
    file = _write_csv(tmp_path / "c.csv", ["image", "caption"], rows)
    pairs = CsvPairs(file, tmp_path)  # files are opened and decoded on read
    with pytest.raises(ImageReadError, match="bad.png"):
        pairs.image(1)


def test_unsupported_extension_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"\.csv or \.jsonl"):
        CsvPairs(tmp_path / "c.txt", tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        CsvPairs(tmp_path / "nope.csv", tmp_path)


# ---------------------------------------------------------------------------- build


def test_build_image_text_pairs(tmp_path):
    paths = _image_tree(tmp_path)
    rows = [[p, f"image {i}"] for i, p in enumerate(paths)]
    _write_csv(tmp_path / "captions_train.csv", ["image", "caption"], rows)
    pattern = str(tmp_path / "captions_{split}.csv")
    train = build_dataset("csv", "train", pairs=True, root=str(tmp_path), file=pattern, image_size=SIZE)
    assert isinstance(train, CsvPairs) and len(train) == 3
    assert build_dataset("csv", "val", pairs=True, root=str(tmp_path), file=pattern, image_size=SIZE) is None
    _write_csv(tmp_path / "captions_val.csv", ["image", "caption"], [[paths[0], "val image"]])
    val = build_dataset("csv", "val", pairs=True, root=str(tmp_path), file=pattern, image_size=SIZE)
    assert len(val) == 1 and val.caption_options(0) == ["val image"]

    digits = build_dataset("digits", "val", pairs=True, image_size=SIZE)
    assert isinstance(digits, DigitsPairs) and len(digits) == 360
    with pytest.raises(ValueError, match="coco.*csv, digits"):
        build_dataset("coco", "train", pairs=True, image_size=SIZE)
    with pytest.raises(MissingMandatoryValue, match="file"):
        build_dataset("csv", "train", pairs=True, image_size=SIZE)
