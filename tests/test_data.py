"""Tests for solo.data: seeding invariances, datasets against independent references."""

import os
import pickle
import random

import numpy as np
import pytest
import torch
from PIL import Image

from solo.data import (
    DATASETS,
    EvalDataset,
    ImageReadError,
    MultiViewDataset,
    SyntheticDataset,
    ViewAugmentation,
    build_dataset,
    build_eval_transform,
    build_view_transform,
    dataset_stats,
    sample_seed,
    seeded_rng,
)

SIZE = 16


def _multiview(seed=7, num_samples=12):
    base = SyntheticDataset(num_samples, SIZE, num_classes=4, seed=3)
    mean, std = dataset_stats("synthetic")
    augs = [ViewAugmentation(blur_prob=0.5), ViewAugmentation(blur_prob=0.1, solarize_prob=0.2)]
    return MultiViewDataset(base, [build_view_transform(a, SIZE, mean, std) for a in augs], seed=seed)


def _reference_view(ds, epoch, index, view):
    # Independent of seeded_rng: seed the global RNGs by hand, then apply the transform.
    torch.manual_seed(sample_seed(ds.seed, epoch, index, view))
    random.seed(sample_seed(ds.seed, epoch, index, view))
    return ds.view_transforms[view](ds.base[index][0])


# ------------------------------------------------------------------------ seeding


def test_sample_seed_is_well_mixed_and_63_bit():
    seeds = {sample_seed(0, e, i, v) for e in range(4) for i in range(50) for v in range(3)}
    assert len(seeds) == 4 * 50 * 3
    assert all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(1, 2, 3, 0) == sample_seed(1, 2, 3, 0)
    # A naive seed + index scheme would collide here.
    assert sample_seed(0, 1, 0, 0) != sample_seed(0, 0, 1, 0)
    with pytest.raises(ValueError, match="index=-1"):
        sample_seed(0, 0, -1, 0)


def test_seeded_rng_restores_global_state():
    torch.manual_seed(11)
    random.seed(11)
    torch_before, py_before = torch.get_rng_state(), random.getstate()
    with seeded_rng(5):
        a = torch.rand(3), random.random()
    with seeded_rng(5):
        b = torch.rand(3), random.random()
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert torch.equal(torch.get_rng_state(), torch_before)
    assert random.getstate() == py_before


# --------------------------------------------------------------------- multiview


def test_views_match_reference_regardless_of_access_order_and_global_rng():
    ds = _multiview()
    expected = [_reference_view(ds, 2, 5, v) for v in range(2)]

    torch.manual_seed(123)
    first = ds[(2, 5)]["views"]
    for i in range(5):
        ds[(2, i)]
    torch.manual_seed(456)
    random.seed(456)
    later = ds[(2, 5)]["views"]
    for v in range(2):
        assert torch.equal(first[v], expected[v])
        assert torch.equal(later[v], expected[v])


def test_different_epoch_or_view_gives_different_tensors():
    ds = _multiview()
    sample = ds[(0, 3)]
    assert sample["index"] == 3 and sample["label"] == 3 % 4
    v0, v1 = sample["views"]
    assert not torch.equal(v0, v1)
    assert not torch.equal(v0, ds[(1, 3)]["views"][0])
    assert not torch.equal(v0, _multiview(seed=8)[(0, 3)]["views"][0])


def test_reading_leaves_global_rng_unchanged():
    ds = _multiview()
    mean, std = dataset_stats("synthetic")
    ev = EvalDataset(ds.base, build_eval_transform(SIZE, mean, std, resize=False))
    assert_global_rng_untouched(lambda: (ds[(0, 1)], ev[1]))


def assert_global_rng_untouched(read) -> None:
    """Calling `read` leaves the torch, Python and NumPy global RNG states as they were."""
    torch_before, py_before = torch.get_rng_state(), random.getstate()
    np_before = np.random.get_state()[1].copy()
    read()
    assert torch.equal(torch.get_rng_state(), torch_before)
    assert random.getstate() == py_before
    assert np.array_equal(np.random.get_state()[1], np_before)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_workers_do_not_change_views(num_workers):
    ds = _multiview()
    keys = [(1, i) for i in (7, 0, 3, 11, 5, 2)]
    loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=keys, num_workers=num_workers)
    batches = list(loader)
    got = [torch.cat([b["views"][v] for b in batches]) for v in range(2)]
    for v in range(2):
        expected = torch.stack([_reference_view(ds, e, i, v) for e, i in keys])
        assert torch.equal(got[v], expected)
    assert torch.cat([b["index"] for b in batches]).tolist() == [i for _, i in keys]


def test_multiview_rejects_plain_index():
    with pytest.raises(TypeError, match=r"\(epoch, index\)"):
        _multiview()[3]


def test_eval_dataset_is_deterministic():
    base = SyntheticDataset(4, SIZE)
    mean, std = dataset_stats("synthetic")
    ev = EvalDataset(base, build_eval_transform(SIZE, mean, std, resize=False))
    out = ev[2]
    ref = (torch.from_numpy(np.array(base[2][0])).permute(2, 0, 1).float() / 255 - 0.5) / 0.5
    assert torch.allclose(out["image"], ref, atol=1e-6)
    assert out["label"] == 2 and out["index"] == 2


# --------------------------------------------------------------------- transforms


def test_view_transform_output_shape_and_dtype():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8))
    mean, std = dataset_stats("imagefolder")
    aug = ViewAugmentation(blur_prob=1.0, solarize_prob=1.0, grayscale_prob=1.0)
    with seeded_rng(0):
        out = build_view_transform(aug, 24, mean, std)(img)
    assert out.shape == (3, 24, 24) and out.dtype == torch.float32
    # Mappings (yaml / DictConfig entries) are accepted and validated.
    out = build_view_transform({"crop_scale": [0.5, 1.0], "hflip_prob": 0.0}, 8, mean, std)(img)
    assert out.shape == (3, 8, 8)
    with pytest.raises(ValueError, match="crop_scale"):
        build_view_transform({"crop_scale": [0.9, 0.1]}, 8, mean, std)
    with pytest.raises(ValueError, match="blur_prb"):
        build_view_transform({"blur_prb": 0.5}, 8, mean, std)


def test_eval_transform_resize_and_center_crop():
    img = Image.fromarray(np.zeros((300, 400, 3), dtype=np.uint8))
    out = build_eval_transform(224, *dataset_stats("imagefolder"), resize=True)(img)
    assert out.shape == (3, 224, 224)


def test_augmentation_yamls_match_schema():
    omegaconf = pytest.importorskip("omegaconf")
    root = os.path.join(os.path.dirname(__file__), "..", "solo", "configs", "augmentation")
    schema = omegaconf.OmegaConf.structured(ViewAugmentation)
    for name in ("simclr", "barlow_twins", "digits"):
        cfg = omegaconf.OmegaConf.load(os.path.join(root, f"{name}.yaml"))
        assert len(cfg.views) == 2
        for view in cfg.views:
            assert set(view) == set(schema) - {"size", "count", "shift_of", "max_shift", "inside_of"}  # own-box fields
            build_view_transform(
                omegaconf.OmegaConf.to_object(omegaconf.OmegaConf.merge(schema, view)), 16, *dataset_stats("digits")
            )


# ------------------------------------------------------------------------- digits


def test_digits_split_sizes_stratified_and_disjoint():
    from sklearn.datasets import load_digits

    train = build_dataset("digits", "train", image_size=SIZE)
    val = build_dataset("digits", "val", image_size=SIZE)
    assert (len(train), len(val)) == (1437, 360)
    assert set(train.source_indices).isdisjoint(val.source_indices)
    assert len(set(train.source_indices) | set(val.source_indices)) == 1797
    counts = np.bincount([val[i][1] for i in range(len(val))], minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    img, label = train[0]
    assert img.mode == "RGB" and img.size == (SIZE, SIZE) and isinstance(label, int)
    assert train.classes[label] == train.classes[int(load_digits().target[train.source_indices[0]])]


def test_digits_pixels_match_sklearn_at_native_size():
    from sklearn.datasets import load_digits

    ref = load_digits()
    val = build_dataset("digits", "val", image_size=8)
    for i in (0, 100, 359):
        src = val.source_indices[i]
        expected = np.round(ref.images[src] * 255 / 16).astype(np.uint8)
        img, label = val[i]
        arr = np.asarray(img)
        assert label == ref.target[src]
        for c in range(3):
            assert np.array_equal(arr[..., c], expected)


def test_digits_stats_match_train_split():
    train = build_dataset("digits", "train", image_size=16)
    pixels = train.images.astype(np.float64) / 255
    mean, std = dataset_stats("digits")
    assert np.allclose(pixels.mean(axis=(0, 1, 2)), mean, atol=1e-3)
    assert np.allclose(pixels.std(axis=(0, 1, 2)), std, atol=1e-3)


# ---------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_and_split_dependent():
    a = build_dataset("synthetic", "train", image_size=SIZE, num_samples=20, num_classes=5, seed=1)
    b = SyntheticDataset(20, SIZE, num_classes=5, seed=1)
    val = build_dataset("synthetic", "val", image_size=SIZE, num_samples=20, num_classes=5, seed=1)
    assert len(a) == 20 and len(a.classes) == 5
    assert np.array_equal(np.asarray(a[13][0]), np.asarray(b[13][0]))
    assert a[13][1] == 3 and a[13][0].size == (SIZE, SIZE)
    assert not np.array_equal(np.asarray(a[13][0]), np.asarray(val[13][0]))
    assert not np.array_equal(np.asarray(a[13][0]), np.asarray(SyntheticDataset(20, SIZE, 5, seed=2)[13][0]))


# -------------------------------------------------------------------- imagefolder


def _write_png(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arr = np.full((6, 5, 3), value, dtype=np.uint8)
    arr[0, 0] = (value, 255 - value, 7)
    Image.fromarray(arr).save(path)
    return arr


def test_imagefolder_labeled(tmp_path):
    written = {}
    for cls, value in (("dog", 10), ("cat", 50)):
        for k in range(2):
            path = str(tmp_path / "train" / cls / f"{k}.png")
            written[path] = (_write_png(path, value + k), cls)
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    _write_png(str(tmp_path / "val" / "dog" / "x.png"), 99)  # val lacks "cat"

    train = build_dataset("imagefolder", "train", root=str(tmp_path), image_size=SIZE)
    assert train.classes == ["cat", "dog"] and len(train) == 4
    for i, (path, _label) in enumerate(train.samples):
        img, got_label = train[i]
        assert img.mode == "RGB"
        assert np.array_equal(np.asarray(img), written[path][0])
        assert train.classes[got_label] == written[path][1]
    val = build_dataset("imagefolder", "val", root=str(tmp_path), image_size=SIZE)
    assert val.classes == ["cat", "dog"] and val[0][1] == 1  # labels agree with train


def test_imagefolder_unlabeled_and_missing_val(tmp_path):
    for k in (2, 0, 1):
        _write_png(str(tmp_path / "train" / f"img{k}.png"), k)
    ds = build_dataset("imagefolder", "train", root=str(tmp_path), image_size=SIZE)
    assert ds.classes is None and len(ds) == 3
    assert [ds[i][1] for i in range(3)] == [-1, -1, -1]
    assert [os.path.basename(p) for p, _ in ds.samples] == ["img0.png", "img1.png", "img2.png"]
    assert build_dataset("imagefolder", "val", root=str(tmp_path), image_size=SIZE) is None


def test_imagefolder_corrupt_file_names_path(tmp_path):
    _write_png(str(tmp_path / "train" / "a" / "good.png"), 1)
    bad = tmp_path / "train" / "a" / "bad.jpg"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 200, dtype=np.uint8).tobytes())
    ds = build_dataset("imagefolder", "train", root=str(tmp_path), image_size=SIZE)
    ds[1]  # good.png sorts after bad.jpg; reading it works
    with pytest.raises(ImageReadError, match="bad.jpg") as err:
        ds[0]
    assert str(bad) in str(err.value) and isinstance(err.value, RuntimeError)


def _odd_images(folder) -> dict:
    """Images of every mode a photo folder holds, and each one's RGB pixels by hand: alpha over white, 16-bit values
    scaled by 255 / 65535, grey and palette colours repeated, CMYK by PIL's own conversion."""
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (6, 5, 1)).astype(np.float64) / 255
    grey16 = rng.integers(0, 65536, (6, 5), dtype=np.uint16)
    grey = colours[..., 0]
    palette = Image.fromarray(colours).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    palette.info["transparency"] = 0
    indices = np.asarray(palette)
    palette_rgb = np.asarray(palette.convert("RGB"))
    files = {
        "rgba.png": (
            Image.fromarray(np.concatenate([colours, np.rint(alpha * 255).astype(np.uint8)], -1), "RGBA"),
            np.rint(colours * alpha + 255 * (1 - alpha)),
        ),
        "grey16.png": (Image.fromarray(grey16), np.repeat(np.rint(grey16 * (255 / 65535))[..., None], 3, -1)),
        "grey.png": (Image.fromarray(grey, "L"), np.repeat(grey[..., None], 3, -1)),
        "palette.png": (palette, np.where((indices == 0)[..., None], 255, palette_rgb)),
        "cmyk.tif": (
            Image.fromarray(colours).convert("CMYK"),
            np.asarray(Image.fromarray(colours).convert("CMYK").convert("RGB")),
        ),
    }
    os.makedirs(folder, exist_ok=True)
    for name, (image, _) in files.items():
        image.save(os.path.join(folder, name))
    return {name: expected for name, (_, expected) in files.items()}


def test_every_reader_makes_rgb_alike_from_any_mode(tmp_path):
    """A folder's reader, the eval transform on a PIL image as a user opens it (the zoo's transform) and the device
    path's raw reader give the same RGB pixels, those computed by hand."""
    from solo.data.decode import raw_image, read_file

    expected = _odd_images(tmp_path / "train")
    folder = build_dataset("imagefolder", "train", root=str(tmp_path), image_size=SIZE)
    to_tensor = build_eval_transform(SIZE, (0.0,) * 3, (1 / 255,) * 3, resize=False)  # pixels as 0..255 floats
    for index, (path, _) in enumerate(folder.samples):
        want = expected[os.path.basename(path)].astype(np.float64)
        image, _ = folder[index]
        assert image.mode == "RGB" and np.array_equal(np.asarray(image, dtype=np.float64), want), path
        with Image.open(path) as opened:  # any mode, as solo.zoo.eval_transform's user gives it
            assert torch.allclose(to_tensor(opened).double().permute(1, 2, 0), torch.from_numpy(want), atol=1e-3)
        pixels, height, width = raw_image(read_file(path), path)
        assert (height, width) == (6, 5) and np.array_equal(pixels.permute(1, 2, 0).numpy(), want), path


def test_unreadable_eval_rows_are_left_out_and_known_without_skip(tmp_path):
    """With skip, an unreadable image's row is marked and dropped by real_rows, and SkippedImages names it once;
    without skip, reading it is the error."""
    from solo.data import eval_loader, real_rows
    from solo.data.decode import SkippedImages
    from solo.eval.features import extract_features

    for k in range(5):
        _write_png(str(tmp_path / "val" / "a" / f"{k}.png"), k)
    (tmp_path / "val" / "a" / "2.png").write_bytes(b"")
    base = build_dataset("imagefolder", "val", root=str(tmp_path), image_size=SIZE)
    transform = build_eval_transform(SIZE, (0.5,) * 3, (0.5,) * 3, resize=True)
    loader = eval_loader(EvalDataset(base, transform, skip_bad=True), 4, 0, 1)
    assert [int(row) for batch in loader for row in real_rows(batch)] == [1, 1, 0, 1, 1]
    said = []
    skipped = SkippedImages(said.append)
    backbone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * SIZE * SIZE, 2))
    for _ in range(2):  # the second pass names nothing again
        features, labels = extract_features(backbone, loader, torch.device("cpu"), skipped=skipped)
    assert features.shape == (4, 2) and labels.tolist() == [0] * 4
    assert len(said) == 1 and str(tmp_path / "val" / "a" / "2.png") in said[0], said
    with pytest.raises(ImageReadError, match="2.png"):
        EvalDataset(base, transform)[2]


def test_imagefolder_missing_root(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError) as err:
        build_dataset("imagefolder", "train", root=str(missing), image_size=SIZE)
    assert str(missing / "train") in str(err.value)


# -------------------------------------------------------------------------- CIFAR


def _dump(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def test_cifar10_standin_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    written = {"train": ([], []), "val": ([], [])}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, 3).tolist()
        _dump(folder / name, {b"batch_label": name.encode(), b"data": data, b"labels": labels})
        split = "val" if name == "test_batch" else "train"
        written[split][0].append(data)
        written[split][1].extend(labels)
    names = [f"c{i}".encode() for i in range(10)]
    _dump(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": 3})

    for split, n in (("train", 15), ("val", 3)):
        ds = build_dataset("cifar10", split, root=str(tmp_path), image_size=32)
        assert len(ds) == n and ds.classes == [f"c{i}" for i in range(10)]
        data = np.concatenate(written[split][0])
        for i in range(n):
            img, label = ds[i]
            r, g, b = data[i, :1024], data[i, 1024:2048], data[i, 2048:]
            arr = np.asarray(img)
            assert arr.shape == (32, 32, 3)
            assert np.array_equal(arr[..., 0].ravel(), r)  # row-major, channel planes R, G, B
            assert np.array_equal(arr[..., 1].ravel(), g)
            assert np.array_equal(arr[..., 2].ravel(), b)
            assert label == written[split][1][i]


def test_cifar100_standin_with_str_keys(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    data = np.arange(2 * 3072, dtype=np.int64).reshape(2, 3072).astype(np.uint8)
    for name in ("train", "test"):
        _dump(folder / name, {"data": data, "fine_labels": [4, 99], "coarse_labels": [0, 1]})
    _dump(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})
    ds = build_dataset("cifar100", "val", root=str(tmp_path), image_size=32)
    assert len(ds.classes) == 100 and [ds[i][1] for i in range(2)] == [4, 99]
    assert np.asarray(ds[1][0])[0, 1, 2] == data[1, 2048 + 1]


def test_cifar_missing_without_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.download") as err:
        build_dataset("cifar10", "train", root=str(tmp_path), image_size=32, download=False)
    assert str(tmp_path / "cifar-10-batches-py") in str(err.value)


# -------------------------------------------------------------------------- build


def test_build_dataset_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_dataset("mnist", "train", image_size=SIZE)
    assert "mnist" in str(err.value)
    for name in DATASETS.names():
        assert name in str(err.value)
    with pytest.raises(ValueError, match="split"):
        build_dataset("digits", "test", image_size=SIZE)
