"""Pictures of a run: training curves from metrics.jsonl, and a 2-D embedding of val features by class.

python -m solo.eval.plots <run dir>     # (re)draws <run dir>/curves.png at any time, also mid-run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _pyplot():
    """matplotlib's pyplot, imported when a picture is drawn: importing it would slow every process's start
    (docs/performance.md)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on cluster nodes
    import matplotlib.pyplot as plt

    return plt


def _panel(key: str) -> str:
    if key == "lr":
        return "learning rate"
    if "loss" in key:
        return "loss"
    if any(s in key for s in ("acc", "recall", "top1", "top5")):
        return "accuracy"
    if "rankme" in key:
        return "effective rank (RankMe)"
    return key


def plot_curves(metrics_file: str | Path, out: str | Path) -> Path:
    """One panel per kind of metric (losses, learning rate, accuracies, then each other metric) against step."""
    metrics_file = Path(metrics_file)
    if not metrics_file.exists():
        raise FileNotFoundError(f"{metrics_file} does not exist: plot a run directory that has logged metrics")
    series: dict[str, tuple[list, list]] = {}
    for line in metrics_file.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        for key, value in event.items():
            if key not in ("step", "epoch", "time") and isinstance(value, (int, float)):
                steps, values = series.setdefault(key, ([], []))
                steps.append(event["step"])
                values.append(value)
    if not series:
        raise ValueError(f"{metrics_file} holds no numeric metrics to plot")
    panels: dict[str, list[str]] = {}
    for key in series:
        panels.setdefault(_panel(key), []).append(key)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, keys) in zip(axes[0], panels.items()):
        for key in keys:
            steps, values = series[key]
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if title == "accuracy":
            ax.set_ylim(0, 1)
        if len(keys) > 1 or title != keys[0]:
            ax.legend(fontsize=7)
    fig.suptitle(metrics_file.parent.name, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def embed_2d(features: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """UMAP when umap-learn is installed, else t-SNE (scikit-learn), after PCA to 50 dimensions."""
    from sklearn.decomposition import PCA

    x = features.astype(np.float64)
    x = (x - x.mean(0)) / (x.std(0) + 1e-8)
    if x.shape[1] > 50 and len(x) > 50:
        x = PCA(50, random_state=seed).fit_transform(x)
    try:
        import umap
    except ImportError:
        from sklearn.manifold import TSNE

        perplexity = min(30.0, (len(x) - 1) / 3)
        return TSNE(2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x), "t-SNE"
    return umap.UMAP(random_state=seed).fit_transform(x), "UMAP"


def plot_embedding(
    features, labels, out: str | Path, classes: list[str] | None = None, title: str = "", max_points: int = 5000
) -> Path:
    """Scatter of a 2-D embedding of `features`, coloured by `labels` (a seeded subsample beyond max_points)."""
    features, labels = np.asarray(features), np.asarray(labels)
    if len(features) > max_points:
        keep = np.random.default_rng(0).choice(len(features), max_points, replace=False)
        features, labels = features[keep], labels[keep]
    points, how = embed_2d(features)
    num_classes = int(labels.max()) + 1
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    cmap = plt.get_cmap("tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "turbo")
    colours = cmap(labels / max(num_classes - 1, 1)) if num_classes > 20 else cmap(labels % cmap.N)
    ax.scatter(points[:, 0], points[:, 1], c=colours, s=8, alpha=0.8, linewidths=0)
    if num_classes <= 20:
        for c in range(num_classes):
            name = classes[c] if classes else str(c)
            ax.scatter([], [], color=cmap(c % cmap.N), label=name, s=20)
            if (labels == c).any():  # the class name at its points' median, to read the picture without a legend
                mx, my = np.median(points[labels == c], axis=0)
                ax.annotate(name, (mx, my), fontsize=8, weight="bold", ha="center")
        ax.legend(fontsize=7, markerscale=1, loc="best", framealpha=0.6)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(
        f"{title} ({how} of {len(features)} val features)" if title else f"{how} of {len(features)} val features"
    )
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Draw <run dir>/curves.png from <run dir>/metrics.jsonl.")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    print(plot_curves(args.run_dir / "metrics.jsonl", args.run_dir / "curves.png"))


if __name__ == "__main__":
    main()
