"""The representation's health metrics (solo.eval.health) against their definitions, and the collapse warning of a
run whose embeddings collapse; their world-size invariance is checked with the 1 x 16 / 2 x 8 runs of
tests/test_train.py::test_world_size_invariance."""

import logging
import math

import numpy as np
import pytest
import torch

from solo.eval.health import alignment_squares, collapse, health, lidar, lidar_sums, rankme, spread, uniformity
from tests.test_train import TINY, compose_cfg


def test_rankme_is_the_exponential_of_the_spectrum_entropy():
    """k equal singular values give an effective rank of k; one nonzero value gives 1; a random matrix gives the
    formula computed here with numpy's SVD: exp(-sum p log p), p = s / sum(s) + 1e-7 (Garrido et al., 2023)."""
    q, _ = torch.linalg.qr(torch.randn(50, 8, dtype=torch.float64))
    assert rankme(q[:, :5] @ torch.eye(5, 12, dtype=torch.float64)) == pytest.approx(5, rel=1e-4)  # eps on 7 zeros
    assert rankme(torch.ones(30, 6)) == pytest.approx(1, rel=1e-5)
    z = np.random.default_rng(0).normal(size=(40, 10)) * np.linspace(0.1, 3, 10)
    s = np.linalg.svd(z, compute_uv=False)
    p = s / s.sum() + 1e-7
    assert rankme(torch.from_numpy(z)) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)


def test_uniformity_is_the_log_mean_gaussian_potential_over_distinct_pairs():
    z = np.random.default_rng(1).normal(size=(12, 5))
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    pairs = [math.exp(-2 * np.sum((u[i] - u[j]) ** 2)) for i in range(12) for j in range(12) if i != j]
    assert uniformity(torch.from_numpy(z)) == pytest.approx(math.log(np.mean(pairs)), rel=1e-12)
    assert uniformity(torch.ones(7, 3)) == pytest.approx(0, abs=1e-12)  # one point: potential 1 everywhere
    assert uniformity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(-8, rel=1e-12)  # antipodes, |d|^2=4


def test_spread_is_about_one_for_an_isotropic_cloud_and_zero_for_one_point():
    assert spread(torch.randn(20000, 32, generator=torch.Generator().manual_seed(0))) == pytest.approx(1, abs=0.02)
    assert spread(torch.ones(50, 32) * 3) == 0


def test_alignment_squares_the_distance_of_each_samples_first_two_views():
    """Rows in view order (3 views of 4 samples): the first two views' normalised rows, distance squared, summed over the
    4 samples; identical views give 0, opposite ones 4 each; one view alone (a method reading one) is refused."""
    z = np.random.default_rng(3).normal(size=(12, 5))
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    expected = sum(np.sum((u[i] - u[4 + i]) ** 2) for i in range(4))
    assert float(alignment_squares(torch.from_numpy(z), 4)) == pytest.approx(expected, rel=1e-12)
    x = torch.randn(4, 5, dtype=torch.float64)
    assert float(alignment_squares(torch.cat([x, 3 * x]), 4)) == pytest.approx(0, abs=1e-12)
    assert float(alignment_squares(torch.cat([x, -x]), 4)) == pytest.approx(16, rel=1e-12)
    with pytest.raises(ValueError, match="two views"):
        alignment_squares(x, 4)


def _lidar_by_hand(x: np.ndarray, delta: float = 1e-4, eps: float = 1e-7) -> float:
    """LiDAR of x (views, samples, D), each sample a class: Sb and Sw by loops, the eigenvalues of Sw^(-1/2) Sb Sw^(-1/2)
    as scipy's generalised eigenvalues of (Sb, Sw), then RankMe's smooth rank."""
    from scipy.linalg import eigh

    q, n, d = x.shape
    means = x.mean(axis=0)
    grand = means.mean(axis=0)
    sb = sum(np.outer(m - grand, m - grand) for m in means) / (n - 1)
    sw = sum(np.outer(x[v, i] - means[i], x[v, i] - means[i]) for v in range(q) for i in range(n)) / (n * (q - 1))
    lam = np.clip(eigh(sb, sw + delta * np.eye(d), eigvals_only=True), 0, None)
    p = lam / lam.sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


def _lidar_of(x: torch.Tensor) -> float:
    views, n, _ = x.shape
    return lidar(lidar_sums(x.flatten(0, 1), n), n, views)


def test_lidar_is_the_smooth_rank_of_the_linear_discriminant_matrix():
    """Against Sb and Sw by loops and scipy's generalised eigenvalues, on 3 views of 30 samples in 6 dimensions, one
    of them with no spread between samples. Known values: features collapsed to one point read 1 (stable-pretraining's
    eps before the normalisation reads 6, the full width, there). The known-wrong per-rank LiDAR (each half of the
    batch apart, averaged) reads another value."""
    g = torch.Generator().manual_seed(3)
    samples = torch.randn(30, 6, generator=g, dtype=torch.float64) * torch.tensor(
        [3, 2, 1, 1, 0.5, 0], dtype=torch.float64
    )
    x = samples + 0.3 * torch.randn(3, 30, 6, generator=g, dtype=torch.float64)
    got = _lidar_of(x)
    assert got == pytest.approx(_lidar_by_hand(x.numpy()), rel=1e-10)
    assert 1.5 < got < 6
    assert _lidar_of(torch.zeros(2, 30, 6, dtype=torch.float64)) == pytest.approx(1.0, abs=1e-4)
    halves = (_lidar_of(x[:, :15]) + _lidar_of(x[:, 15:])) / 2
    assert abs(halves - got) > 1e-2 * got
    with pytest.raises(ValueError, match="at least 2 classes"):
        lidar(lidar_sums(x[:, :1].flatten(0, 1), 1), 1, 3)


def test_metrics_of_one_shard_are_not_those_of_the_split():
    """The known-wrong way: each rank's metrics on its own shard. Half the samples read another effective rank and
    uniformity than the whole split (which the world-size invariance test holds equal at W = 1 and 2)."""
    z = torch.randn(64, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    whole, shard = health(z, z), health(z[::2], z[::2])
    assert whole["val/rankme"] != pytest.approx(shard["val/rankme"], rel=1e-3)
    assert whole["val/uniformity"] != pytest.approx(shard["val/uniformity"], rel=1e-3)


def trained(run_dir, zero_projector: bool, epochs: int) -> dict:
    from solo.distributed.env import process_group
    from solo.train.trainer import Trainer

    cfg = compose_cfg(TINY + ["method=simclr", "data.batch_size=32", f"trainer.max_epochs={epochs}"])  # 2 steps each
    with process_group() as (env, device):
        trainer = Trainer(cfg, run_dir, env, device)
        if zero_projector:  # the projector's output multiplied by zero: every sample embedded at one point
            trainer.model.method.projector.register_forward_hook(lambda module, args, out: out * 0)
        return trainer.fit()


@pytest.mark.slow  # two short runs: the quick suite is near its 4 minutes
@pytest.mark.one_process
def test_a_collapsed_run_says_so_once_and_a_healthy_one_does_not(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="solo"):
        # 2 epochs: after 1 the embeddings' spread was within 1 % of the bound below (0.100 in float32's reordering)
        healthy = trained(tmp_path / "healthy", zero_projector=False, epochs=2)
    assert not [r for r in caplog.records if "collapsed" in r.getMessage()], caplog.text
    assert collapse(healthy) is None and healthy["val/embedding_std"] > 0.1 and healthy["val/embedding_rankme"] > 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="solo"):
        collapsed = trained(tmp_path / "collapsed", zero_projector=True, epochs=2)  # warned at the first only
    warned = [r.getMessage() for r in caplog.records if "collapsed" in r.getMessage()]
    assert len(warned) == 1 and "val/embedding_std" in warned[0], caplog.text
    assert collapsed["val/embedding_std"] == 0 and collapsed["val/embedding_rankme"] < 1.5
