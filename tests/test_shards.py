"""data=webdataset: shards written by solo.data.make_shards and read by index hold exactly the source files (checked
with the webdataset library's own reader), every global batch is the same on any world size and worker count,
training on shards is world-size invariant and resumes bit-identical, and damaged samples are skipped the same
way everywhere and reported."""

import logging
import shlex
import subprocess
import tarfile
import time

import pytest
import torch
import webdataset as wds

from solo.data import MultiViewDataset, SyntheticDataset, build_view_transforms
from solo.data.decode import ImageReadError
from solo.data.make_shards import main as make_shards
from solo.data.sampling.source import MapDataSource
from solo.data.sources.pairs import CsvPairs
from solo.data.sources.shards import ShardDataset, ShardPairs
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.train.trainer import pretrain
from tests.test_train import (
    TINY,
    compose_cfg,
    kill_processes_mentioning,
    launch,
    many_runs,
    metrics,
    run,
    weights,
    weights_at_init,
)

NUM_IMAGES, PER_SHARD = 192, 24  # 8 shards; a global batch of 16 divides the epoch, so every sample is read


def write_folder(root, count=NUM_IMAGES, classes=4):
    """An ImageFolder split of tiny images, PNG and JPEG mixed; returns {file name: (bytes, class name)}."""
    files = {}
    images = SyntheticDataset(count, 16, num_classes=classes, seed=0)
    for i in range(count):
        image, label = images[i]
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:04d}.{'png' if i % 3 else 'jpg'}"
        image.save(path)
        files[path.name] = (path.read_bytes(), f"class_{label}")
    return files


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder") / "train"
    return root, write_folder(root)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, folder):
    out = tmp_path_factory.mktemp("shards")
    assert make_shards(["imagefolder", str(folder[0]), str(out), "--samples-per-shard", str(PER_SHARD)]) == 0
    return out, f"{out}/{{00000..00007}}.tar"


def test_shards_hold_the_files_and_read_back_as_webdataset_reads_them(folder, shards, tmp_path, capsys):
    _, files = folder
    out, spec = shards
    assert sorted(p.name for p in out.glob("*.tar")) == [f"{i:05d}.tar" for i in range(8)]
    by_content = {data: name for name, (data, _) in files.items()}
    dataset = ShardDataset(spec, cache_dir=str(tmp_path))
    assert len(dataset) == NUM_IMAGES and dataset.classes == [f"class_{c}" for c in range(4)] and not dataset.problems
    # The webdataset library's streaming reader over the same tars: same samples, same order, same bytes.
    streamed = list(wds.WebDataset(spec, shardshuffle=False, empty_check=False))
    assert len(streamed) == NUM_IMAGES
    for i, sample in enumerate(streamed):
        ext = "jpg" if "jpg" in sample else "png"
        assert dataset.member(i, ext) == sample[ext]
        name = by_content[sample[ext]]  # each sample is one source file, byte for byte, with its class
        assert (
            name.endswith(ext)
            and dataset.classes[dataset.label(i)] == files[name][1] == dataset.classes[int(sample["cls"])]
        )
    assert sorted(
        by_content[dataset.member(i, "jpg") or dataset.member(i, "png")] for i in range(NUM_IMAGES)
    ) == sorted(files)
    # Written in a shuffled order: the first shard mixes the classes.
    assert len({dataset.label(i) for i in range(PER_SHARD)}) == 4


def test_epoch_order_shuffles_shards_then_samples_within_windows(shards, tmp_path):
    dataset = ShardDataset(shards[1], cache_dir=str(tmp_path), shuffle_window=2)
    order = dataset.epoch_order(seed=0, epoch=0)
    assert sorted(order) == list(range(NUM_IMAGES))
    assert order == dataset.epoch_order(0, 0) and order != dataset.epoch_order(0, 1) != dataset.epoch_order(1, 0)
    shard_of = [s for s in range(8) for _ in range(PER_SHARD)]
    window = 2 * PER_SHARD
    blocks = [{shard_of[i] for i in order[w : w + window]} for w in range(0, NUM_IMAGES, window)]
    assert all(len(b) == 2 for b in blocks), "each window of the order holds the samples of 2 whole shards"
    assert len(set().union(*blocks)) == 8
    within = order[:window]
    assert within != sorted(within), "samples are shuffled within the window"


def batches(dataset, workers, batch_size=8, world_size=1, rank=0, epoch=1):
    views = build_view_transforms([{"crop_scale": [0.5, 1.0]}] * 2, 16, (0.5,) * 3, (0.5,) * 3)
    source = MapDataSource(
        MultiViewDataset(dataset, views, seed=3, skip_bad=True),
        batch_size,
        rank,
        world_size,
        seed=3,
        order=dataset.epoch_order,
        num_workers=workers,
    )
    source.epoch = epoch
    return list(source)


def test_zero_one_and_two_workers_and_any_world_size_read_the_same_batches(shards, tmp_path):
    dataset = ShardDataset(shards[1], cache_dir=str(tmp_path))
    reference = batches(dataset, workers=0, batch_size=16)
    assert len(reference) == NUM_IMAGES // 16
    for workers in (1, 2):
        for a, b in zip(reference, batches(dataset, workers=workers, batch_size=16), strict=True):
            assert torch.equal(a["index"], b["index"]) and all(
                torch.equal(x, y) for x, y in zip(a["views"], b["views"])
            )
    rank0, rank1 = (
        batches(dataset, 0, batch_size=8, world_size=2, rank=0),
        batches(dataset, 0, batch_size=8, world_size=2, rank=1),
    )
    for whole, first, second in zip(reference, rank0, rank1, strict=True):
        assert torch.equal(whole["index"], torch.cat([first["index"], second["index"]]))
        assert torch.equal(whole["views"][0], torch.cat([first["views"][0], second["views"][0]]))


def damaged_shards(folder, out):
    """The folder's shards with the 6th image of shards 0, 1, 2 overwritten by garbage and the last shard cut
    mid-sample; returns the broken members' names."""
    make_shards(["imagefolder", str(folder), str(out), "--samples-per-shard", str(PER_SHARD)])
    broken = []
    for shard in ("00000.tar", "00001.tar", "00002.tar"):
        with tarfile.open(out / shard) as tar:
            member = tar.getmembers()[5 * 2 + 1]  # two members per sample: .cls, then the image
        with open(out / shard, "r+b") as f:
            f.seek(member.offset_data)
            f.write(b"not an image"[: member.size] * (member.size // 12))
        broken.append(member.name)
    last = out / "00007.tar"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    return broken


def test_damaged_samples_are_reported_and_skipped_the_same_way_everywhere(folder, tmp_path):
    broken = damaged_shards(folder[0], tmp_path / "shards")
    dataset = ShardDataset(f"{tmp_path}/shards/{{00000..00007}}.tar", cache_dir=str(tmp_path / "cache"))
    assert len(dataset) < NUM_IMAGES and len(dataset.problems) == 1 and "00007.tar" in dataset.problems[0]
    assert "breaks off" in dataset.problems[0] or "truncated" in dataset.problems[0]
    for shard, name in enumerate(broken):
        with pytest.raises(ImageReadError, match=f"cannot read sample '{name.split('.')[0]}'"):
            dataset.image(shard * PER_SHARD + 5)
    whole = batches(dataset, workers=0, batch_size=16)
    split = [batches(dataset, workers=1, batch_size=8, world_size=2, rank=r) for r in (0, 1)]
    skipped = sum(int(b["skipped"].sum()) for b in whole)
    assert skipped >= 1 and skipped == sum(int(b["skipped"].sum()) for rank in split for b in rank)
    for w, a, b in zip(whole, *split):
        assert torch.equal(w["views"][1], torch.cat([a["views"][1], b["views"][1]]))


def test_shards_fetched_by_url_are_cached_and_read_the_same(shards, tmp_path):
    out, spec = shards
    local = ShardDataset(spec, cache_dir=str(tmp_path / "a"))
    fetched = ShardDataset(f"pipe:cat {out}/{{00000..00007}}.tar", cache_dir=str(tmp_path / "b"))
    assert len(list((tmp_path / "b").glob("*.tar"))) == 8
    assert all(local.member(i, "cls") == fetched.member(i, "cls") for i in range(0, NUM_IMAGES, 7))
    assert fetched.classes == ["0", "1", "2", "3"], "classes.txt is read beside local shards only"


def test_caption_pairs_from_a_csv(tmp_path, folder):
    root, files = folder
    rows = ["image,caption,label"] + [
        f"{f.parent.name}/{f.name},a picture of {f.parent.name} number {f.stem},{f.parent.name[-1]}"
        for f in sorted(root.glob("*/*"))[:40]
    ]
    (tmp_path / "captions.csv").write_text("\n".join(rows) + "\n")
    assert (
        make_shards(
            [
                "csv",
                str(tmp_path / "captions.csv"),
                str(tmp_path / "shards"),
                "--root",
                str(root),
                "--samples-per-shard",
                "16",
            ]
        )
        == 0
    )
    pairs = ShardPairs(f"{tmp_path}/shards/{{00000..00002}}.tar", cache_dir=str(tmp_path / "cache"))
    source = CsvPairs(tmp_path / "captions.csv", root)
    by_caption = {source.captions[i]: i for i in range(len(source))}
    assert len(pairs) == len(source) == 40
    for i in range(len(pairs)):
        j = by_caption[pairs.caption_options(i)[0]]
        assert pairs.label(i) == source.label(j)
        assert torch.equal(torch.tensor(list(pairs.image(i).getdata())), torch.tensor(list(source.image(j).getdata())))


def test_missing_shards_setting_says_what_to_set():
    with pytest.raises(
        ConfigError, match=r"data.shards is required and not set: add data.shards=\.\.\. to the command line"
    ):
        pretrain(compose_cfg(["data=webdataset"]), "/nonexistent-run-dir")


SHARD_RUN = [o for o in TINY if not o.startswith("data")] + [
    "data=webdataset",
    "data.image_size=16",
    "data.num_workers=1",
    "trainer.precision=64",
]


def shard_overrides(spec, cache, batch, steps=3):
    return SHARD_RUN + [
        f"data.shards='{spec}'",
        f"data.cache_dir={cache}",
        f"data.batch_size={batch}",
        f"trainer.max_steps={steps}",
    ]


# The readers themselves at any world size stay in the quick suite (test_zero_one_and_two_workers_...).
@pytest.mark.slow
def test_training_on_shards_is_world_size_invariant(folder, tmp_path, caplog):
    """1 process x 16 and 2 processes x 8 on shards with a broken sample: same weights (float64), same skips logged.
    The 2 processes make their views in the workers, then (a second run of the same launch) on the device (JPEGs
    decoded there, PNGs in the workers): the same views either way, so the same weights as the 1 process that makes
    them in its workers."""
    damaged_shards(folder[0], tmp_path / "shards")
    spec, cache = f"{tmp_path}/shards/{{00000..00007}}.tar", tmp_path / "cache"
    steps = (NUM_IMAGES - PER_SHARD) // 16 + 1  # the whole first epoch (what the cut shard leaves), into the second
    with caplog.at_level(logging.INFO):
        pretrain(compose_cfg(shard_overrides(spec, cache, 16, steps) + ["data.augment_on=cpu"]), tmp_path / "w1")
    assert "00007.tar" in caplog.text, "the damaged shard is reported at the start"
    two = {
        tmp_path / f"w2-{where}": shard_overrides(spec, cache, 8, steps) + [f"data.augment_on={where}"]
        for where in ("cpu", "device")
    }
    many_runs(two)
    one, start = weights(tmp_path / "w1"), weights_at_init(shard_overrides(spec, cache, 16))
    moved = max(
        float((one[k] - start[k]).abs().max()) for k in one if k.startswith("method.")
    )  # the probe has 4 classes here
    logged_skips = [m["data/skipped_images"] for m in metrics(tmp_path / "w1") if "data/skipped_images" in m]
    assert sum(logged_skips) >= 1
    for run_dir in two:
        worst, name = max((float((one[k] - v).abs().max()), k) for k, v in weights(run_dir).items())
        assert worst <= 1e-10 * moved, f"{run_dir.name}: {name}: W=1 and W=2 differ by {worst}"
        skips = [m["data/skipped_images"] for m in metrics(run_dir) if "data/skipped_images" in m]
        assert skips == logged_skips, run_dir.name


@pytest.mark.slow
def test_killed_run_on_shards_resumes_bit_identical(shards, tmp_path):
    common = shard_overrides(shards[1], tmp_path / "cache", 8, steps=16) + ["trainer.checkpoint_every_steps=3"]
    run(common, tmp_path / "straight", nproc=2)
    killed = tmp_path / "killed"
    proc = launch(common, killed, nproc=2, torchrun=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while not (killed / "checkpoints" / "step-000000006").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    kill_processes_mentioning(str(killed))
    proc.wait()
    assert 0 < read_checkpoint(killed / "checkpoints" / "last")["step"] < 16, "the kill lands mid-run"
    assert "resuming from" in run(common, killed, nproc=2)
    straight, resumed = weights(tmp_path / "straight"), weights(killed)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.slow  # about 25 s; the pairs reader itself is checked in the default suite
def test_clip_trains_on_caption_shards(tmp_path, folder):
    """Image-text pairs from shards end to end: CLIP's run reads the .txt captions and evaluates on val shards."""
    from tests.test_clip import TINY_CLIP

    root, _ = folder
    rows = ["image,caption,label"] + [
        f"{f.parent.name}/{f.name},a picture of {f.parent.name.replace('_', ' ')},{f.parent.name[-1]}"
        for f in sorted(root.glob("*/*"))[:64]
    ]
    (tmp_path / "captions.csv").write_text("\n".join(rows) + "\n")
    for split in ("train", "val"):
        make_shards(
            [
                "csv",
                str(tmp_path / "captions.csv"),
                str(tmp_path / split),
                "--root",
                str(root),
                "--samples-per-shard",
                "32",
            ]
        )
    run_dir = tmp_path / "run"
    pretrain(
        compose_cfg(
            TINY_CLIP
            + [
                "data=webdataset",
                "data.image_size=16",
                "data.batch_size=16",
                "trainer.max_steps=4",
                f"data.shards='{tmp_path}/train/{{00000..00001}}.tar'",
                f"data.val_shards='{tmp_path}/val/{{00000..00001}}.tar'",
                f"data.cache_dir={tmp_path / 'cache'}",
            ]
        ),
        run_dir,
    )
    val = [m for m in metrics(run_dir) if "val/zeroshot_acc1" in m]
    assert val and 0 <= val[-1]["val/zeroshot_acc1"] <= 1 and "val/i2t_recall1" in val[-1]


def pasted_shard_settings(tmp_path, capsys) -> list[str]:
    """make_shards' last lines for a train and a val split (in a folder whose name a shell and Hydra both need
    quoted), split as a shell splits them: the val line's key renamed to data.val_shards, as its reader does."""
    words = []
    for split, key in (("train", "data.shards"), ("val", "data.val_shards")):
        write_folder(tmp_path / "images" / split, count=32)
        out = tmp_path / "it's my shards" / split
        assert (
            make_shards(["imagefolder", str(tmp_path / "images" / split), str(out), "--samples-per-shard", "16"]) == 0
        )
        line = capsys.readouterr().out.splitlines()[-1]
        assert line.startswith("'data.shards=") and line.endswith("'"), line  # one word for the shell, quoted
        words += shlex.split(line.replace("data.shards=", f"{key}=", 1))
    assert len(words) == 2
    return words


def test_the_printed_shards_setting_pastes_as_hydra_reads_it(tmp_path, capsys):
    """The line to paste reaches Hydra as the shards' brace pattern (a bare `data.shards=/x/{00000..00001}.tar`
    does not parse), the config validates, and the pattern reads the shards."""
    words = pasted_shard_settings(tmp_path, capsys)
    cfg = compose_cfg(SHARD_RUN + words + [f"data.cache_dir={tmp_path / 'cache'}"])
    for key, split in (("shards", "train"), ("val_shards", "val")):
        assert cfg.data[key] == f"{tmp_path}/it's my shards/{split}/{{00000..00001}}.tar"
        assert len(ShardDataset(cfg.data[key], cache_dir=str(tmp_path / "cache"))) == 32


@pytest.mark.slow  # one main_pretrain.py process: 1 step, with its imports
@pytest.mark.one_process
def test_the_printed_shards_setting_runs_main_pretrain(tmp_path, capsys):
    words = pasted_shard_settings(tmp_path, capsys)
    extra = [f"data.cache_dir={tmp_path / 'cache'}", "data.batch_size=8", "trainer.max_steps=1"]
    out = run(SHARD_RUN + words + extra, tmp_path / "run")
    assert "done: 1 steps" in out and metrics(tmp_path / "run")
