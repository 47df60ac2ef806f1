"""Offline and online evaluation: k-NN, retrieval and the linear probe against independent references,
main_linear end to end (cache, plots, fine-tuning), and the online k-NN and retrieval equal to the offline ones."""

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from solo.distributed.checkpoint import read_checkpoint
from solo.downstream.offline import evaluate_pretrained
from solo.errors import SoloError
from solo.eval.knn import knn_accuracy, knn_logits
from solo.eval.linear import LinearProtocol, train_linear
from solo.eval.plots import plot_curves
from solo.eval.retrieval import retrieval_metrics
from tests.test_accumulate import CASES
from tests.test_train import REPO, TINY, metrics, run, weights


def compose_linear(overrides):
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        return compose("linear", overrides=overrides)


def test_knn_matches_a_loop_over_neighbours():
    g = torch.Generator().manual_seed(0)
    train, labels = torch.randn(50, 8, generator=g), torch.randint(0, 4, (50,), generator=g)
    queries = torch.randn(7, 8, generator=g)
    k, t = 5, 0.1
    expected = np.zeros((7, 4))
    for i, q in enumerate(queries.numpy()):
        sims = [q @ x / np.linalg.norm(q) / np.linalg.norm(x) for x in train.numpy()]
        for j in np.argsort(sims)[::-1][:k]:
            expected[i, labels[j]] += np.exp(sims[j] / t)
    got = knn_logits(train, labels, queries, num_classes=4, k=k, temperature=t, chunk=3)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4)


def test_knn_of_the_train_set_itself_with_k1_is_perfect():
    x, y = torch.randn(30, 5), torch.arange(30) % 3
    assert knn_accuracy(x, y, x, y, num_classes=3, k=1)["acc1"] == 1.0


def _retrieval_by_hand(gallery, gallery_labels, queries, query_labels):
    """MAP@R and recall@1, @5 (Musgrave et al. 2020), query by query: the gallery sorted by cosine similarity with
    Python's sorted, the precision at each of the first R ranks where the item is of the query's class."""

    def cosine(q, g):
        return sum(a * b for a, b in zip(q, g)) / (sum(a * a for a in q) * sum(b * b for b in g)) ** 0.5

    aps, recall = [], {1: [], 5: []}
    for q, label in zip(queries.tolist(), query_labels.tolist()):
        similarity = [cosine(q, g) for g in gallery.tolist()]
        order = sorted(range(len(gallery)), key=lambda i: -similarity[i])
        same = [int(gallery_labels[i]) == label for i in order]
        r = sum(int(y) == label for y in gallery_labels.tolist())
        aps.append(sum(sum(same[: i + 1]) / (i + 1) for i in range(r) if same[i]) / r)
        for k in recall:
            recall[k].append(any(same[:k]))
    return {"map_at_r": sum(aps) / len(aps)} | {f"recall_at_{k}": sum(v) / len(v) for k, v in recall.items()}


def test_retrieval_matches_a_query_by_query_ranking():
    """Against the definitions, on two noisy clusters per class; then known values: classes far apart read 1 on every
    metric, and the known-wrong per-rank gallery (each half of the train split ranked apart, as ranks that do not
    gather their features would) reads another MAP@R."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 6, generator=g, dtype=torch.float64)
    gallery_labels, query_labels = torch.arange(40) % 4, torch.arange(13) % 4
    gallery = centres[gallery_labels] + 0.9 * torch.randn(40, 6, generator=g, dtype=torch.float64)
    queries = centres[query_labels] + 0.9 * torch.randn(13, 6, generator=g, dtype=torch.float64)
    got = retrieval_metrics(gallery, gallery_labels, queries, query_labels, chunk=5)
    want = _retrieval_by_hand(gallery, gallery_labels, queries, query_labels)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], abs=1e-12) for k in want)
    assert 0.2 < got["map_at_r"] < 0.95  # neither chance nor perfect: the noise mixes the classes
    halves = [
        retrieval_metrics(gallery[s], gallery_labels[s], queries, query_labels) for s in (slice(0, 20), slice(20, None))
    ]
    assert abs(sum(h["map_at_r"] for h in halves) / 2 - got["map_at_r"]) > 1e-3
    apart = retrieval_metrics(
        100 * centres[gallery_labels] + gallery, gallery_labels, 100 * centres[query_labels], query_labels
    )
    assert apart == {"map_at_r": 1.0, "recall_at_1": 1.0, "recall_at_5": 1.0}


def test_linear_probe_matches_logistic_regression_on_digits_pixels():
    x, y = load_digits(return_X_y=True)
    xt, xv, yt, yv = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(xt)
    reference = LogisticRegression(max_iter=3000).fit(scaler.transform(xt), yt).score(scaler.transform(xv), yv)
    as_tensors = lambda a, b: (torch.tensor(a, dtype=torch.float32), torch.tensor(b))  # noqa: E731
    logged = []
    _, ours = train_linear(as_tensors(xt, yt), as_tensors(xv, yv), 10, LinearProtocol(epochs=50), log=logged.append)
    assert abs(ours["val/acc1"] - reference) <= 0.02, (ours, reference)
    assert len(logged) == 50 and logged[-1]["val/acc1"] == ours["val/acc1"]


def test_linear_probe_on_random_labels_stays_near_chance():
    x = torch.randn(400, 32)
    y = torch.randint(0, 10, (400,))
    _, ours = train_linear((x[:300], y[:300]), (x[300:], y[300:]), 10, LinearProtocol(epochs=30))
    assert ours["val/acc1"] < 0.25


def _looks_drawn(path, min_colours=4):
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[0] > 200 and image.shape[1] > 200
    assert len(np.unique(image.reshape(-1, 3), axis=0)) >= min_colours  # not blank: axes, points, several colours


@pytest.mark.slow
def test_online_knn_equals_offline_knn_and_plots_are_written(tmp_path, monkeypatch):
    """2-process pretraining with the online k-NN; main_linear on its checkpoint (1 process) gets the same k-NN."""
    monkeypatch.setenv("SOLO_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    run(TINY + ["data.batch_size=8", "trainer.max_steps=8", "trainer.knn_k=5", "trainer.plots=true"], run_dir, nproc=2)
    online = [m for m in metrics(run_dir) if "val/knn_acc1" in m][-1]
    for png in ("curves.png", "embedding.png"):
        _looks_drawn(run_dir / png, min_colours=10 if png == "embedding.png" else 4)

    cfg_overrides = [
        f"pretrained={run_dir}",
        "data=synthetic",
        "data.image_size=16",
        "data.num_samples=64",
        "data.num_workers=0",
        "knn.k=5",
        "linear.epochs=20",
    ]
    cfg = compose_linear(cfg_overrides)
    summary = evaluate_pretrained(cfg, tmp_path / "eval")
    assert summary["knn"]["acc1"] == pytest.approx(online["val/knn_acc1"], abs=1e-9)
    assert summary["knn"]["acc5"] == pytest.approx(online["val/knn_acc5"], abs=1e-9)
    for key in ("map_at_r", "recall_at_1", "recall_at_5"):  # 2 processes online, 1 offline: the same ranking
        assert summary["retrieval"][key] == pytest.approx(online[f"val/retrieval_{key}"], abs=1e-9), key
    logged = [json.loads(line) for line in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in logged if "val/linear_acc1" in m] == list(range(20))
    assert (
        json.loads((tmp_path / "eval" / "summary.json").read_text())["linear"]["acc1"] == logged[-2]["val/linear_acc1"]
    )
    for png in ("curves.png", "embedding.png"):
        _looks_drawn(tmp_path / "eval" / png)

    # torchrun main_linear.py: features extracted in two shards give the same results, cached or not.
    for attempt in ("extract", "cached"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                "--standalone",
                "main_linear.py",
                *cfg_overrides,
                f"hydra.run.dir={tmp_path / attempt}",
            ],
            cwd=REPO,
            env=os.environ | {"SOLO_CACHE": str(tmp_path / "cache2")},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert ("train features from the cache" in out.stdout) == (attempt == "cached")
        two = json.loads((tmp_path / attempt / "summary.json").read_text())
        for kind in ("linear", "knn"):
            assert two[kind]["acc1"] == pytest.approx(summary[kind]["acc1"], abs=1.5 / 64), kind  # one val image

    # The second evaluation reads the cached features and gives the same numbers.
    cached = list((tmp_path / "cache" / "features").iterdir())
    assert len(cached) == 2
    mtimes = [p.stat().st_mtime_ns for p in cached]
    again = evaluate_pretrained(cfg, tmp_path / "eval2")
    assert again["linear"] == summary["linear"] and again["knn"] == summary["knn"]
    assert [p.stat().st_mtime_ns for p in cached] == mtimes


@pytest.mark.slow
@pytest.mark.one_process
def test_random_init_and_finetune(tmp_path, monkeypatch):
    monkeypatch.setenv("SOLO_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    run(TINY + ["data.batch_size=8", "trainer.max_steps=4"], run_dir)
    assert not (run_dir / "curves.png").exists()  # trainer.plots=false
    common = [
        f"pretrained={run_dir}",
        "data=synthetic",
        "data.image_size=16",
        "data.num_samples=64",
        "data.num_workers=0",
        "data.batch_size=16",
        "linear.epochs=5",
        "plots=false",
    ]
    trained = evaluate_pretrained(
        compose_linear(common + ["finetune.enabled=true", "finetune.epochs=2"]), tmp_path / "a"
    )
    baseline = evaluate_pretrained(compose_linear(common + ["random_init=true"]), tmp_path / "b")
    assert trained["random_init"] is False and baseline["random_init"] is True
    # Other weights, other features: each backbone's validation features, as main_linear cached them (the probe's
    # accuracy cannot tell them apart where both reach 1.0).
    cached = [torch.load(f, weights_only=True) for f in (tmp_path / "cache" / "features").glob("*.pt")]
    val = [c["features"] for c in cached if c["key"].endswith("|val")]
    assert len(val) == 2 and val[0].shape == val[1].shape and not torch.allclose(val[0], val[1])
    assert 0.0 <= trained["finetune"]["acc1"] <= 1.0 and "fine-tuning" in trained["finetune"]["protocol"]
    assert [m["epoch"] for m in metrics(tmp_path / "a" / "finetune") if "val/acc1" in m] == [0, 1]  # its own run dir
    assert metrics(tmp_path / "a")[-1]["val/finetune_acc1"] == trained["finetune"]["acc1"]


@pytest.mark.slow  # two pretraining runs and main_linear.py on each: about 11 s
@pytest.mark.one_process
def test_main_linear_probes_the_feature_the_method_probed_unless_told(tmp_path):
    """I-JEPA's online probe reads the mean patch token: main_linear does too unless given pool=cls."""
    run_dir = tmp_path / "run"
    run(CASES["ijepa_vit"], run_dir)
    common = [
        f"pretrained={run_dir}",
        "data=digits",  # 360 val images: the two features' results differ
        "data.image_size=16",
        "data.num_workers=0",
        "linear.epochs=2",
        "plots=false",
        "feature_cache=false",
    ]
    results = {
        pool: evaluate_pretrained(compose_linear(common + ([f"pool={pool}"] if pool else [])), tmp_path / str(pool))
        for pool in (None, "mean", "cls")
    }
    assert str(OmegaConf.load(tmp_path / "None" / "config.yaml").pool) == "mean"
    assert results[None]["linear"] == results["mean"]["linear"]
    assert results[None]["knn"] == results["mean"]["knn"] != results["cls"]["knn"]
    assert results[None]["linear"] != results["cls"]["linear"]


def test_main_linear_reads_nepa_s_middle_block_unless_told(tmp_path):
    """NEPA's weights are probed after the middle of their blocks (Method.feature_depth) as its online probe was:
    main_linear records feature_blocks=2 of a 4-block ViT, and the result is feature_blocks=2's, not that of all 4;
    an explicit value wins; one past the depth, or on a ResNet, is an error that names the key."""
    from solo.backbones import build_backbone
    from solo.zoo.weights import Pretrained, save_weights

    backbone_cfg = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 16, "patch_size": 4, "depth": 4}}
    digits = {"name": "digits", "image_size": 16, "mean": [0.3054] * 3, "std": [0.3187] * 3}
    torch.manual_seed(0)
    vit, _ = build_backbone(backbone_cfg)
    nepa = save_weights(
        Pretrained(vit.state_dict(), "backbone", backbone_cfg, {"name": "nepa"}, digits, "test"),
        tmp_path / "n.safetensors",
    )
    common = [f"pretrained={nepa}", "data=digits", "data.image_size=16", "data.num_workers=0", "linear.epochs=1"]
    common += ["plots=false", "feature_cache=false"]
    results = {
        blocks: evaluate_pretrained(
            compose_linear(common + ([f"feature_blocks={blocks}"] if blocks else [])), tmp_path / str(blocks)
        )
        for blocks in (None, 2, 4)
    }
    assert OmegaConf.load(tmp_path / "None" / "config.yaml").feature_blocks == 2
    assert results[None]["knn"] == results[2]["knn"] != results[4]["knn"]
    with pytest.raises(SoloError, match="feature_blocks=5: the ViT has 4 blocks"):
        evaluate_pretrained(compose_linear(common + ["feature_blocks=5"]), tmp_path / "5")
    resnet_cfg = {"name": "resnet18", "small_stem": True}
    resnet, _ = build_backbone(resnet_cfg)
    simclr = save_weights(
        Pretrained(resnet.state_dict(), "backbone", resnet_cfg, {"name": "simclr"}, digits, "test"),
        tmp_path / "r.safetensors",
    )
    with pytest.raises(SoloError, match="feature_blocks=2 reads a Vision Transformer"):
        evaluate_pretrained(
            compose_linear([f"pretrained={simclr}"] + common[1:] + ["feature_blocks=2"]), tmp_path / "r"
        )


FINETUNE_32 = [
    "data=synthetic",
    "data.image_size=16",
    "data.num_samples=128",
    "data.num_workers=0",
    "data.batch_size=8",
    "linear.epochs=1",
    "plots=false",
    "feature_cache=false",
    "finetune.enabled=true",
    "finetune.epochs=2",
    "finetune.precision=64",
    "finetune.checkpoint_every_steps=1",
    "finetune.log_every_steps=1",
]


def _main_linear(overrides, run_dir, **popen):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "main_linear.py", *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, **popen
    )


@pytest.mark.slow
@pytest.mark.one_process
def test_finetuning_killed_and_resumed_is_bit_identical(tmp_path):
    """main_linear.py fine-tuning (float64, 2 epochs of 16 steps) killed after a checkpoint and run again ends with the
    weights of the uninterrupted run, bit for bit; a run with another seed does not (so the comparison can fail)."""
    run(TINY + ["data.batch_size=8", "trainer.max_steps=2"], tmp_path / "pre")
    common = [f"pretrained={tmp_path / 'pre'}", *FINETUNE_32]
    assert _main_linear(common, tmp_path / "whole").wait(timeout=600) == 0
    killed = _main_linear(common, tmp_path / "killed", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = tmp_path / "killed" / "finetune" / "checkpoints" / "last"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline and killed.poll() is None:
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    stopped_at = read_checkpoint(last)["step"]
    assert 0 < stopped_at < 32, f"killed at step {stopped_at}: not mid-run"
    assert _main_linear(common, tmp_path / "killed").wait(timeout=600) == 0
    whole, resumed = weights(tmp_path / "whole" / "finetune"), weights(tmp_path / "killed" / "finetune")
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert metrics(tmp_path / "killed")[-1]["val/finetune_acc1"] == metrics(tmp_path / "whole")[-1]["val/finetune_acc1"]
    assert _main_linear(common + ["seed=1"], tmp_path / "seed1").wait(timeout=600) == 0
    assert not all(torch.equal(whole[k], v) for k, v in weights(tmp_path / "seed1" / "finetune").items())


@pytest.mark.slow
@pytest.mark.one_process
def test_finetuning_takes_any_optimizer_and_precision(tmp_path):
    run(TINY + ["data.batch_size=8", "trainer.max_steps=2"], tmp_path / "pre")
    overrides = [
        f"pretrained={tmp_path / 'pre'}",
        *FINETUNE_32[:-4],
        "finetune.epochs=1",
        "finetune.precision=bf16",
        "optim@finetune.optim=adamw",
        "finetune.optim.lr=1e-3",
        "finetune.optim.betas=[0.9,0.95]",
    ]
    summary = evaluate_pretrained(compose_linear(overrides), tmp_path / "eval")
    assert "adamw" in summary["finetune"]["protocol"] and "precision bf16" in summary["finetune"]["protocol"]
    with pytest.raises(SoloError, match=r"finetune\.optim\.betas"):
        evaluate_pretrained(compose_linear(overrides + ["finetune.optim.betas=[0.9,1.5]"]), tmp_path / "bad")


def test_plot_curves_needs_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl does not exist"):
        plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.0}\n')
    _looks_drawn(plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png"))


@pytest.mark.slow
@pytest.mark.one_process
def test_unlabelled_data_is_refused(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "val").mkdir(parents=True)
    for split in ("train", "val"):
        for i in range(4):
            Image.new("RGB", (16, 16), (i * 40, 0, 0)).save(tmp_path / "data" / split / f"{i}.png")
    run_dir = tmp_path / "run"
    run(TINY + ["data.batch_size=8", "trainer.max_steps=2"], run_dir)
    cfg = compose_linear(
        [f"pretrained={run_dir}", "data=imagefolder", f"data.root={tmp_path / 'data'}", "data.image_size=16"]
    )
    with pytest.raises(ValueError, match="needs labelled train and val splits"):
        evaluate_pretrained(cfg, tmp_path / "eval")


def _eval_set(n: int):
    from solo.data import EvalDataset, SyntheticDataset, build_eval_transform

    return EvalDataset(
        SyntheticDataset(n, 8, num_classes=3, split="val"),
        build_eval_transform(8, (0.5,) * 3, (0.25,) * 3, resize=False),
    )


def _eval_model():
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3),
        torch.nn.BatchNorm2d(6),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )
    return backbone, torch.nn.Linear(6, 3)


def _evaluate_sharded(n: int, batch: int, strategy: str):
    """The online probe's accuracy and the k-NN's features of an `n`-sample val set on this rank's share."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from solo.data import eval_loader
    from solo.eval.features import extract_features
    from solo.eval.probe import accuracy

    backbone, probe = _eval_model()
    if strategy == "fsdp":  # every block's forward all-gathers its parameters: the ranks' forwards must pair up
        for module in (backbone[0], backbone, probe):
            fully_shard(module)
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    loader = eval_loader(_eval_set(n), batch, rank, world)
    features, labels = extract_features(backbone, loader, torch.device("cpu"))
    return accuracy(probe, features, labels, torch.device("cpu")), features, labels, len(loader)


def _sharded_eval_worker(rank, world, store, cases, queue):
    import torch.distributed as dist

    # A collective that waits 30 s fails (gloo's default: 30 min): a mismatched count is an error, not a hang.
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    for n, batch, strategy in cases:
        accuracy, features, labels, batches = _evaluate_sharded(n, batch, strategy)
        queue.put((rank, n, strategy, (accuracy, features.numpy(), labels.numpy(), batches)))  # tensors die with it
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_evaluation_of_a_split_that_does_not_divide_evenly_ends_and_counts_each_sample_once():
    """17, 3 and 1 val samples on 2 ranks (batch 8: 2 batches against 1; a rank with 1 row; a rank with none) under
    FSDP and DDP: every rank runs as many batches (FSDP's all-gathers pair up: no hang), and the probe's accuracy and
    the gathered features equal one process's on the whole set. The naive shard, range(rank, N, W), gives the ranks
    different batch counts (the hang) and an empty rank."""
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader

    from solo.losses.check import worker_context

    cases = [(n, 8, strategy) for n in (17, 3, 1) for strategy in ("fsdp", "ddp")]
    queue = worker_context().SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _sharded_eval_worker, args=(2, f"{tmp}/store", cases, queue), nprocs=2, start_method="forkserver"
        )
    results = [queue.get() for _ in range(2 * len(cases))]
    for n, batch, strategy in cases:
        accuracy, features, labels, _ = _evaluate_sharded(n, batch, "one process")
        ranks = [r for rank, m, s, r in results if (m, s) == (n, strategy)]
        assert len(ranks) == 2 and ranks[0][3] == ranks[1][3]  # as many batches on each rank
        for got_accuracy, got_features, got_labels, _ in ranks:
            assert got_accuracy == accuracy
            np.testing.assert_allclose(got_features, features.numpy(), rtol=1e-6, atol=1e-6)
            assert np.array_equal(got_labels, labels.numpy()) and len(labels) == n
    naive = {
        n: [len(DataLoader(_eval_set(n), batch_size=8, sampler=range(r, n, 2))) for r in range(2)] for n in (17, 1)
    }
    assert naive == {17: [2, 1], 1: [1, 0]}
