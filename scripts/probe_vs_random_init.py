"""Linear probe of a pretraining run's backbone beside the same backbone at random initialisation.

    python scripts/probe_vs_random_init.py outputs/simclr-digits-resnet18-seed0

Features of the train and val splits (evaluation transform, no augmentation) from the run's
checkpoints/last.pt and from a freshly initialised backbone (same config and seed) are standardised
and fitted with the same L2-regularised logistic regression; prints val top-1 for both.
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from solo.data import DATASET_STATS, EvalDataset, build_dataset, build_eval_transform
from solo.train.loop import build_model


@torch.no_grad()
def features(backbone, dataset, batch_size=256):
    backbone.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    feats, labels = zip(*[(backbone(b["image"]), b["label"]) for b in loader])
    return torch.cat(feats).numpy(), torch.cat(labels).numpy()


def probe_accuracy(backbone, train, val) -> float:
    (xt, yt), (xv, yv) = features(backbone, train), features(backbone, val)
    scaler = StandardScaler().fit(xt)
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(scaler.transform(xt), yt)
    return float(np.mean(clf.predict(scaler.transform(xv)) == yv))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    cfg = OmegaConf.load(args.run_dir / "config.yaml")
    d = cfg.data
    mean, std = DATASET_STATS["imagenet" if d.name == "imagefolder" else d.name]
    transform = build_eval_transform(d.image_size, mean, std, resize=d.name == "imagefolder")
    splits = [
        EvalDataset(build_dataset(d.name, split, root=d.root, image_size=d.image_size, num_samples=d.num_samples,
                                  num_classes=d.num_classes, seed=cfg.trainer.seed), transform)
        for split in ("train", "val")
    ]
    torch.manual_seed(cfg.trainer.seed)
    random_init = build_model(cfg, None)
    trained = build_model(cfg, None)
    state = torch.load(args.run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    trained.load_state_dict({k: v for k, v in state.items() if not k.startswith("probe.")})
    for name, model in (("random init", random_init), ("pretrained", trained)):
        print(f"{name:>12}: linear probe val top-1 {probe_accuracy(model.method.backbone, *splits):.4f}")


if __name__ == "__main__":
    main()
