"""Offline evaluation of pretrained weights (main_linear.py): linear and k-NN classification on frozen,
cached features, zero-shot for image-text models, an embedding picture, and optional full fine-tuning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from solo.backbones.vit import blocks_at, is_vit, pool_patch_tokens, read_features_after
from solo.config import check_required, plain, validate_linear
from solo.data import DATASETS, EvalDataset, build_eval_transform, build_split, data_locations, eval_loader
from solo.data.decode import SkippedImages
from solo.data.sampling.source import loader_workers
from solo.distributed import DistEnv
from solo.distributed.env import process_group
from solo.distributed.run_dir import hold_run_dir
from solo.downstream.finetune import finetune
from solo.errors import ConfigError
from solo.eval.features import FeatureCache, extract_features, state_fingerprint
from solo.eval.knn import knn_accuracy
from solo.eval.linear import LinearProtocol, train_linear
from solo.eval.plots import plot_curves, plot_embedding
from solo.eval.probe import topk_correct
from solo.eval.retrieval import retrieval_metrics
from solo.eval.zero_shot import class_embeddings, class_prompts
from solo.loggers import Loggers
from solo.methods import METHODS
from solo.zoo.files import cache_dir
from solo.zoo.pretrained import resolve
from solo.zoo.teachers import with_teacher

log = logging.getLogger("solo")


def evaluate_pretrained(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Evaluate cfg.pretrained on cfg.data; returns (and writes to <run_dir>/summary.json) the results."""
    cfg = validate_linear(cfg)
    check_required(cfg)
    with process_group() as (env, device), hold_run_dir(run_dir):  # its fine-tuning's <run dir>/finetune included
        return _evaluate(cfg, Path(run_dir), env, device)


def _evaluate(cfg: DictConfig, run_dir: Path, env: DistEnv, device: torch.device) -> dict:
    say = log.info if env.is_main else (lambda *a, **k: None)
    d = cfg.data
    pretrained = with_teacher(resolve(cfg.pretrained))
    if pretrained.data["image_size"] != d.image_size:
        if pretrained.method.get("model"):  # open_clip's image towers take one size only
            raise ConfigError(
                f"data.image_size={d.image_size}: {cfg.pretrained} has open_clip's image tower "
                f"({pretrained.method['model']}) for {pretrained.data['image_size']} px images; evaluate "
                f"with data.image_size={pretrained.data['image_size']}"
            )
        say(
            f"note: {cfg.pretrained} was pretrained at {pretrained.data['image_size']}px, evaluated at data.image_size={d.image_size}"
        )
    torch.manual_seed(cfg.seed)  # random_init: the baseline's weights depend on the seed only
    backbone = pretrained.build_backbone(random_init=cfg.random_init).to(device)
    _choose_features(cfg, pretrained, backbone, say)
    # Image data sets as images; csv (image-text) by its pairs, which index as (image, label) too.
    dataset = DATASETS[d.name]
    train_base, val_base = (build_split(d, split, cfg.seed, pairs=not dataset.images) for split in ("train", "val"))
    if train_base is None or val_base is None or not train_base.classes:
        raise ConfigError(
            f"data={d.name}: linear evaluation needs labelled train and val splits, and this data has none"
        )
    classes = list(train_base.classes)
    transform = build_eval_transform(d.image_size, *dataset.stats, resize=dataset.any_size)

    extractor = CachedFeatures(cfg, backbone, transform, env, device)
    train, val = extractor(train_base, "train"), extractor(val_base, "val")
    summary = {
        "pretrained": cfg.pretrained,
        "random_init": cfg.random_init,
        "data": d.name,
        "num_classes": len(classes),
    }
    logger = None
    if env.is_main:
        say(f"features: train {tuple(train[0].shape)}, val {tuple(val[0].shape)}")
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(plain(cfg), run_dir / "config.yaml")
        logger = Loggers(run_dir, cfg.logger, plain(cfg), None)
        summary |= _frozen_results(cfg, pretrained, train, val, classes, logger, device)
        if cfg.plots:
            title = f"{cfg.pretrained}{' (random init)' if cfg.random_init else ''} on {d.name}"
            plot_embedding(val[0].numpy(), val[1].numpy(), run_dir / "embedding.png", classes, title=title)
    if cfg.finetune.enabled:
        if env.world_size > 1:
            dist.barrier()
        if is_vit(backbone):  # fine-tuning trains and reads every block
            read_features_after(backbone, len(backbone.blocks))
        summary["finetune"] = finetune(cfg, backbone, pretrained.backbone, len(classes), run_dir, env, device)
        if summary["finetune"] is None:  # preempted: checkpointed, no summary until it is done
            return summary
    if env.is_main:
        step = cfg.linear.epochs * -(-len(train[0]) // cfg.linear.batch_size)
        final = {
            f"val/{k.replace('_', '')}_{m}": v[m]
            for k, v in summary.items()
            if k in ("knn", "zero_shot", "finetune")
            for m in ("acc1", "acc5")
        } | {f"val/retrieval_{k}": v for k, v in summary.get("retrieval", {}).items() if k != "protocol"}
        logger.log({"step": step, **final})  # the linear results are already logged per epoch
        logger.close()
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if cfg.plots:
            plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
        say(_format_summary(summary, run_dir))
    return summary


def _choose_features(cfg: DictConfig, pretrained, backbone, say) -> None:
    """Set `backbone`'s frozen feature: `pool` and, for a ViT, `feature_blocks`; unset, the ones the method that
    trained the weights probes (Method.pool, Method.feature_depth), recorded in config.yaml and the feature cache's
    key as chosen."""
    method = METHODS[pretrained.method["name"]].target if pretrained.method["name"] in METHODS else None
    if cfg.pool is None:
        cfg.pool = method.pool if method else "cls"
    if cfg.pool == "mean":
        pool_patch_tokens(backbone)
    if not is_vit(backbone):
        if cfg.feature_blocks is not None:
            raise ConfigError(
                f"feature_blocks={cfg.feature_blocks} reads a Vision Transformer's features after some of its blocks, "
                f"and {cfg.pretrained} has a {type(backbone).__name__}: unset it"
            )
        return
    depth = len(backbone.blocks)
    if cfg.feature_blocks is None:
        cfg.feature_blocks = blocks_at(backbone, method.feature_depth if method else 1.0)
    read_features_after(backbone, cfg.feature_blocks)
    if cfg.feature_blocks < depth:
        say(f"features: after block {cfg.feature_blocks} of {depth} (feature_blocks; fine-tuning runs all)")


class CachedFeatures:
    """Frozen-backbone features of a split, from the feature cache or extracted in shards over the ranks."""

    def __init__(self, cfg: DictConfig, backbone, transform, env: DistEnv, device: torch.device):
        d = cfg.data
        self.backbone, self.transform, self.env, self.device, self.data = backbone, transform, env, device, d
        self.cache = FeatureCache(cache_dir() / "features" if cfg.feature_cache else None)
        say = log.info if env.is_main else (lambda *a, **k: None)
        self.skipped = SkippedImages(say) if d.on_bad_image == "skip" else None  # names each image left out
        mean, std = DATASETS[d.name].stats
        # What decides the images: the dataset's keys, but for how they are read and the data's name (data.id).
        # data.on_bad_image is kept: features cached with skip leave rows out, and without skip a bad file must stop.
        read_only = ("batch_size", "num_workers", "check_images", "augment_on", "download", "id")
        images = json.dumps(
            {k: v for k, v in plain(d).items() if k not in read_only}
            | data_locations(d)  # relative paths made whole
            | {"mean": mean, "std": std, "seed": cfg.seed, "pool": str(cfg.pool), "blocks": cfg.feature_blocks},
            sort_keys=True,
        )
        self.key_prefix = f"{state_fingerprint(backbone)}|{images}"

    def __call__(self, base, split: str):
        """(features, labels) on rank 0; on the other ranks None when rank 0 found them in its cache."""
        env, key = self.env, f"{self.key_prefix}|{split}"
        hit = self.cache.get(key) if env.is_main else None
        if env.world_size > 1:  # all ranks extract together, or none does
            found = torch.tensor([int(hit is not None)], device=self.device)
            dist.broadcast(found, 0)
            if found.item() and not env.is_main:
                return None
        if hit is not None:
            log.info(f"{split} features from the cache {self.cache.path(key)}")
            return hit
        d = self.data
        loader = eval_loader(
            EvalDataset(base, self.transform, skip_bad=self.skipped is not None),
            d.batch_size,
            env.rank,
            env.world_size,
            num_workers=loader_workers(d.num_workers),
        )
        x, y = extract_features(self.backbone, loader, self.device, skipped=self.skipped)
        if env.is_main:
            self.cache.put(key, x, y)
        return x, y


def _frozen_results(cfg: DictConfig, pretrained, train, val, classes, logger, device) -> dict:
    """Linear (logged per epoch), k-NN, retrieval and, for image-text models, zero-shot results on frozen features."""
    protocol = LinearProtocol(**OmegaConf.to_container(cfg.linear, resolve=True))
    _, linear = train_linear(
        (train[0].to(device), train[1].to(device)),
        (val[0].to(device), val[1].to(device)),
        len(classes),
        protocol,
        log=lambda m: logger.log({k.replace("val/", "val/linear_"): v for k, v in m.items()}),
    )
    results = {"linear": {"acc1": linear["val/acc1"], "acc5": linear["val/acc5"], "protocol": protocol.describe()}}
    knn = knn_accuracy(*train, *val, len(classes), cfg.knn.k, cfg.knn.temperature)
    results["knn"] = knn | {
        "protocol": f"weighted k-NN on cosine similarity, k={cfg.knn.k}, temperature {cfg.knn.temperature}"
    }
    results["retrieval"] = retrieval_metrics(*train, *val) | {
        "protocol": "the val images ranking the train split by cosine similarity: MAP@R and recall@1, @5 by class"
    }
    if pretrained.contents == "model" and not cfg.random_init:
        results["zero_shot"] = _zero_shot(pretrained, val, classes, cfg.data.name, device)
    return results


@torch.no_grad()
def _zero_shot(pretrained, val, classes, data_name: str, device) -> dict:
    model = pretrained.build_model().to(device).eval()
    prompts = class_prompts(data_name, classes)
    classifier = class_embeddings(model, prompts, model.tokenizer, device, torch.float32)
    image = model.embed_features(val[0].to(device))
    c1, c5 = topk_correct((image @ classifier.T).cpu(), val[1])
    n = len(val[1])
    return {
        "acc1": c1 / n,
        "acc5": c5 / n,
        "protocol": f"zero-shot with {len(prompts[0])} prompt(s) per class, averaged",
    }


def _format_summary(summary: dict, run_dir: Path) -> str:
    lines = [f"{summary['pretrained']}{' (random init)' if summary['random_init'] else ''} on {summary['data']}:"]
    for kind in ("linear", "knn", "zero_shot", "finetune"):
        if kind in summary:
            r = summary[kind]
            lines.append(f"  {kind:<10} acc1 {r['acc1']:.4f}  acc5 {r['acc5']:.4f}   ({r['protocol']})")
    if "retrieval" in summary:
        r = summary["retrieval"]
        scores = "  ".join(f"{k} {v:.4f}" for k, v in r.items() if k != "protocol")
        lines.append(f"  retrieval  {scores}   ({r['protocol']})")
    lines.append(f"  written to {run_dir}/summary.json")
    return "\n".join(lines)
