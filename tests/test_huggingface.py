"""data=huggingface: datasets written with the `datasets` library itself (save_to_disk) or by solo's converter (Parquet)
read back exactly; training on them is world-size invariant and resumes bit-identical, for images with labels and for
image-text pairs; a broken image is skipped and counted; bad settings are errors naming the key."""

import io
import subprocess
import time

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from solo.data import HuggingFaceImages, HuggingFacePairs, SyntheticDataset, build_dataset
from solo.data.decode import ImageReadError
from solo.data.make_shards import main as make_shards
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError, DataError, NotFound
from solo.train.trainer import pretrain
from tests.test_eval import compose_linear
from tests.test_shards import write_folder
from tests.test_train import (
    TINY,
    compose_cfg,
    kill_processes_mentioning,
    launch,
    metrics,
    run,
    weights,
    weights_at_init,
)

NUM_TRAIN, NUM_VAL, BROKEN = 64, 32, 9  # row BROKEN of the train split holds bytes that are no image


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def synthetic_split(count: int, split: str, broken: int | None = None) -> datasets.Dataset:
    images = SyntheticDataset(count, 16, num_classes=4, seed=0, split=split)
    rows = {"image": [], "label": [], "caption": []}
    for i in range(count):
        image, label = images[i]
        rows["image"].append({"bytes": b"not an image" if i == broken else png(image), "path": None})
        rows["label"].append(label)
        rows["caption"].append([f"a picture of class {label}", f"class {label}, number {i}"])
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["w", "x", "y", "z"]),
            "caption": datasets.Sequence(datasets.Value("string")),
        }
    )
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A DatasetDict written by save_to_disk: train (one broken image) and validation."""
    path = tmp_path_factory.mktemp("hf") / "synthetic"
    datasets.DatasetDict(
        {"train": synthetic_split(NUM_TRAIN, "train", BROKEN), "validation": synthetic_split(NUM_VAL, "val")}
    ).save_to_disk(str(path))
    return path


def hf_overrides(path, batch: int, steps: int) -> list[str]:
    return [o for o in TINY if not o.startswith("data.num_samples")] + [
        "data=huggingface",
        f"data.path={path}",
        "data.image_size=16",
        "data.num_workers=0",
        "data.on_bad_image=skip",
        f"data.batch_size={batch}",
        f"trainer.max_steps={steps}",
        "trainer.precision=64",
    ]


def test_reads_images_labels_and_classes_as_written(saved):
    train = build_dataset("huggingface", "train", path=str(saved))
    reference = SyntheticDataset(NUM_TRAIN, 16, num_classes=4, seed=0, split="train")
    assert isinstance(train, HuggingFaceImages) and len(train) == NUM_TRAIN and train.classes == ["w", "x", "y", "z"]
    for i in (0, 1, 63):
        image, label = train[i]
        assert np.array_equal(np.asarray(image), np.asarray(reference[i][0])) and label == reference[i][1]
    with pytest.raises(ImageReadError, match=f"row {BROKEN} of split 'train'"):
        train.image(BROKEN)
    pairs = build_dataset("huggingface", "val", path=str(saved), caption_column="caption", pairs=True)
    assert isinstance(pairs, HuggingFacePairs) and pairs.caption_options(5) == [
        "a picture of class 1",
        "class 1, number 5",
    ]
    assert build_dataset("huggingface", "val", path=str(saved), val_split=None) is None


def test_converter_writes_parquet_that_datasets_reads_back(tmp_path):
    """make_shards --format parquet from an ImageFolder and from a captions CSV: the datasets library reads back the
    files' bytes, the folder names as ClassLabel names, the captions; data=huggingface reads the splits by name."""
    files = write_folder(tmp_path / "folder" / "train", count=24)
    write_folder(tmp_path / "folder" / "val", count=8)
    out = tmp_path / "parquet"
    for split in ("train", "val"):
        assert (
            make_shards(
                [
                    "imagefolder",
                    str(tmp_path / "folder" / split),
                    str(out),
                    "--format",
                    "parquet",
                    "--samples-per-shard",
                    "10",
                ]
            )
            == 0
        )
    loaded = datasets.load_dataset(str(out))
    assert sorted(loaded) == ["train", "validation"] and len(loaded["train"]) == 24
    assert loaded["train"].features["label"].names == ["class_0", "class_1", "class_2", "class_3"]
    raw = loaded["train"].cast_column("image", datasets.Image(decode=False))
    read = {row["image"]["path"]: (row["image"]["bytes"], raw.features["label"].names[row["label"]]) for row in raw}
    assert read == files
    assert len(build_dataset("huggingface", "val", path=str(out))) == 8

    rows = ["image,caption,label"] + [
        f"train/{f.parent.name}/{f.name},a picture of {f.parent.name},{f.parent.name[-1]}"
        for f in sorted((tmp_path / "folder" / "train").glob("*/*"))
    ]
    (tmp_path / "captions.csv").write_text("\n".join(rows) + "\n")
    assert (
        make_shards(
            [
                "csv",
                str(tmp_path / "captions.csv"),
                str(tmp_path / "pairs"),
                "--format",
                "parquet",
                "--root",
                str(tmp_path / "folder"),
            ]
        )
        == 0
    )
    pairs = build_dataset(
        "huggingface", "train", path=str(tmp_path / "pairs"), val_split=None, caption_column="caption", pairs=True
    )
    assert sorted(pairs.caption_options(i)[0] for i in range(len(pairs))) == sorted(r.split(",")[1] for r in rows[1:])
    assert all(pairs.caption_options(i)[0].endswith(str(pairs.label(i))) for i in range(len(pairs)))


@pytest.mark.parametrize(
    "keys, error, message",
    [
        (
            {"image_column": "img"},
            ConfigError,
            r"data.image_column='img': split 'train' of .* its columns: \['image', 'label', 'caption'\]",
        ),
        ({"label_column": "class"}, ConfigError, r"data.label_column='class'"),
        ({"label_column": "caption"}, DataError, r"data.label_column='caption' holds .*data.label_column=null"),
        (
            {"train_split": "training"},
            ConfigError,
            r"data.train_split='training': .* its splits: \['train', 'validation'\]",
        ),
    ],
)
def test_bad_settings_name_the_key(saved, keys, error, message):
    with pytest.raises(error, match=message):
        build_dataset("huggingface", "train", path=str(saved), **keys)


def test_missing_split_path_and_captions_are_named(saved, tmp_path):
    with pytest.raises(ConfigError, match=r"data.val_split='test'.*data.val_split=null"):
        build_dataset("huggingface", "val", path=str(saved), val_split="test")
    with pytest.raises(NotFound, match="data.path="):
        build_dataset("huggingface", "train", path=str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match=r"data.caption_column is not set"):
        build_dataset("huggingface", "train", path=str(saved), pairs=True)


@pytest.mark.slow  # a pretraining run, then main_linear.py: about 8 s
@pytest.mark.one_process
def test_linear_evaluation_of_unlabelled_data_is_refused(saved, tmp_path):
    from solo.downstream.offline import evaluate_pretrained
    from tests.test_train import run as pretrain_run

    pretrain_run(TINY + ["trainer.max_steps=1", "data.batch_size=8"], tmp_path / "pre")
    cfg = compose_linear(
        [
            f"pretrained={tmp_path / 'pre'}",
            "data=huggingface",
            f"data.path={saved}",
            "data.image_size=16",
            "data.label_column=null",
            "data.num_workers=0",
            "plots=false",
            "feature_cache=false",
        ]
    )
    with pytest.raises(ConfigError, match="linear evaluation needs labelled"):
        evaluate_pretrained(cfg, tmp_path / "eval")


@pytest.mark.slow  # two launches, ~20 s; as tests/test_shards.py checks shards end to end
def test_training_is_world_size_invariant_and_counts_the_broken_image(saved, tmp_path):
    """1 process x 16 and 2 processes x 8 (one DataLoader worker each, views made on the device from the encoded bytes),
    4 steps in float64: the same weights to 1e-10 of their movement; the broken image is skipped in both, counted the
    same."""
    run(hf_overrides(saved, 16, 4), tmp_path / "w1")
    run(hf_overrides(saved, 8, 4) + ["data.num_workers=1", "data.augment_on=device"], tmp_path / "w2", nproc=2)
    one, two, start = weights(tmp_path / "w1"), weights(tmp_path / "w2"), weights_at_init(hf_overrides(saved, 16, 4))
    moved = max(float((one[k] - start[k]).abs().max()) for k in one if k.startswith("method."))
    worst, name = max((float((one[k] - two[k]).abs().max()), k) for k in one)
    assert worst <= 1e-10 * moved, f"{name}: W=1 and W=2 differ by {worst}"
    skips = [sum(m.get("data/skipped_images", 0) for m in metrics(tmp_path / d)) for d in ("w1", "w2")]
    assert skips[0] == skips[1] == 1  # the epoch of 64 rows reads row BROKEN once


CLIP = [
    "method=clip",
    "augmentation=clip",
    "method.embed_dim=16",
    "method.text.width=16",
    "method.text.depth=1",
    "method.text.heads=2",
    "data.caption_column=caption",
]


@pytest.mark.slow
@pytest.mark.exhaustive  # CI: the image datasets' invariance (below) and the other sources' resumes
def test_image_text_invariance_and_killed_run_resumes_bit_identical(saved, tmp_path):
    """Image-text pairs (CLIP, a caption drawn per epoch from each row's list): 1 x 16 == 2 x 8 (float64); a 2-process
    run killed after a mid-epoch checkpoint and restarted ends bit-identical. (A killed run on a Hugging Face dataset
    of images: tests/test_user_job.py, under FSDP.)"""
    common = [o for o in hf_overrides(saved, 8, 10) if not o.startswith("method.proj_")] + CLIP
    whole_batch = [o.replace("data.batch_size=8", "data.batch_size=16") for o in common]
    pretrain(compose_cfg(whole_batch), tmp_path / "w1")
    run(common, tmp_path / "w2", nproc=2)
    one, two = weights(tmp_path / "w1"), weights(tmp_path / "w2")
    start = weights_at_init(whole_batch)
    moved = max(float((one[k] - start[k]).abs().max()) for k in one if k.startswith("method."))
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-10 * moved
    killed = tmp_path / "killed"
    proc = launch(
        common + ["trainer.checkpoint_every_steps=3"],
        killed,
        nproc=2,
        torchrun=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 180
    while not (killed / "checkpoints" / "step-000000006").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    kill_processes_mentioning(str(killed))
    proc.wait()
    assert 0 < read_checkpoint(killed / "checkpoints" / "last")["step"] < 10, "the kill lands mid-run"
    assert "resuming from" in run(common + ["trainer.checkpoint_every_steps=3"], killed, nproc=2)
    straight, resumed = weights(tmp_path / "w2"), weights(killed)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_a_method_that_learns_from_labels_refuses_unlabelled_data(saved, tmp_path):
    with pytest.raises(
        ConfigError, match=r"method=supcon learns from the labels, and data=huggingface's train split has none"
    ):
        pretrain(compose_cfg(hf_overrides(saved, 16, 1) + ["method=supcon", "data.label_column=null"]), tmp_path)
