"""Zero-shot classification and image<->text retrieval for image-text models (CLIP)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from solo.data import DIGIT_TEMPLATES, digit_caption, real_rows
from solo.distributed import gather, world_size
from solo.eval.mode import eval_mode
from solo.eval.probe import TopkAccuracy, topk_correct

IMAGENET_ZEROSHOT = Path(__file__).parent / "data" / "imagenet_zeroshot.json"


@functools.cache
def imagenet_zeroshot() -> dict:
    """ImageNet-1k for zero-shot classification: "wnids" (the 1000 WordNet ids, sorted: the standard class
    order), "classnames" (CLIP's names for them, in that order) and "templates" (CLIP's 80 prompts, '{}' the name)."""
    return json.loads(IMAGENET_ZEROSHOT.read_text())


def class_names(classes: list[str]) -> list[str]:
    """Readable names for class folder names: CLIP's ImageNet name for a WordNet id (n01440764 -> tench), else
    the folder name with underscores as spaces."""
    data = imagenet_zeroshot()
    names = dict(zip(data["wnids"], data["classnames"]))
    return [names.get(c, c.replace("_", " ")) for c in classes]


def class_prompts(data_name: str, classes: list[str]) -> list[list[str]]:
    """Prompts per class: the digits caption templates for digits, else CLIP's 80 ImageNet templates filled with
    each class's name (see class_names)."""
    if data_name == "digits":
        return [[digit_caption(t, c) for t in DIGIT_TEMPLATES] for c in range(len(classes))]
    templates = imagenet_zeroshot()["templates"]
    return [[t.format(name) for t in templates] for name in class_names(classes)]


@torch.no_grad()
def class_embeddings(method, prompts: list[list[str]], tokenizer, device, dtype) -> torch.Tensor:
    """One unit vector per class: the mean of its prompts' text embeddings, renormalised (CLIP's prompt ensembling)."""
    rows = []
    for class_prompts in prompts:
        tokens = tokenizer(class_prompts).to(device)
        rows.append(F.normalize(method.encode_text(tokens).to(dtype).mean(dim=0), dim=0))
    return torch.stack(rows)


@torch.no_grad()
def zero_shot_accuracy(method, prompts: list[list[str]], loader, device, autocast) -> dict:
    """Top-1/5 zero-shot accuracy of image-text `method` over a labelled image loader (an EvalDataset, sharded over
    ranks: counts are summed), each class's classifier the mean embedding of its `prompts`."""
    dtype = method.log_logit_scale.dtype
    accuracy = TopkAccuracy()
    with eval_mode(method):
        classifier = class_embeddings(method, prompts, method.tokenizer, device, dtype)
        for batch in loader:
            real = real_rows(batch)
            with autocast():
                image = method.encode_image(batch["image"].to(device, dtype, non_blocking=True))[real.to(device)]
            accuracy.add(image.to(dtype) @ classifier.T, batch["label"][real])
    result = accuracy.result(device)
    return {"acc1": result["acc1"], "acc5": result["acc5"]}


def _recall(queries, keys, query_ids, key_ids, ks=(1, 5)) -> torch.Tensor:
    """Hits among the k most similar keys, where the hit is the key with the query's own sample index."""
    top = (queries @ keys.T).topk(min(max(ks), keys.shape[0]), dim=1).indices
    hits = key_ids[top] == query_ids[:, None]
    return torch.tensor([float(hits[:, :k].any(dim=1).sum()) for k in ks], dtype=torch.float64)


@torch.no_grad()
def evaluate_image_text(method, probe, classifier, loader, device, autocast) -> dict:
    """One pass over the val pairs: zero-shot top-1/5 (when `classifier` is given), retrieval recall@1/5
    both ways over the whole val set (embeddings gathered from all ranks), and the online probe."""
    dtype = method.log_logit_scale.dtype
    images, texts, ids = [], [], []
    counts = torch.zeros(5, dtype=torch.float64)  # zero-shot top1, top5, probe top1, top5, samples
    with eval_mode(method, probe):
        for batch in loader:
            real = real_rows(batch)
            with autocast():  # every row through the towers (the same calls on every rank), then the padding dropped
                features = method.image_features(batch["image"].to(device, dtype, non_blocking=True))
                image = method.embed_features(features)[real.to(device)]
                text = method.encode_text(batch["text"].to(device, non_blocking=True))[real.to(device)]
                logits = probe(features)[real.to(device)].float() if probe is not None else None
            labels = batch["label"][real]
            if classifier is not None:
                counts[0:2] += torch.tensor(
                    topk_correct((image.to(classifier.dtype) @ classifier.T).float().cpu(), labels)
                )
            if logits is not None:
                counts[2:4] += torch.tensor(topk_correct(logits.cpu(), labels))
            counts[4] += len(labels)
            images.append(image.float())
            texts.append(text.float())
            ids.append(batch["index"][real].to(device))

    image, text, index = torch.cat(images), torch.cat(texts), torch.cat(ids)
    all_image, all_text, all_index = gather(image), gather(text), gather(index)
    recall = torch.cat([_recall(image, all_text, index, all_index), _recall(text, all_image, index, all_index)])
    totals = torch.cat([counts, recall])
    if world_size() > 1:
        totals = totals.to(device)
        dist.all_reduce(totals)
        totals = totals.cpu()
    zs1, zs5, p1, p5, n, i2t1, i2t5, t2i1, t2i5 = totals.tolist()
    metrics = {
        "val/i2t_recall1": i2t1 / n,
        "val/i2t_recall5": i2t5 / n,
        "val/t2i_recall1": t2i1 / n,
        "val/t2i_recall5": t2i5 / n,
    }
    if classifier is not None:
        metrics.update({"val/zeroshot_acc1": zs1 / n, "val/zeroshot_acc5": zs5 / n})
    if probe is not None:
        metrics.update({"val/acc1": p1 / n, "val/acc5": p5 / n})
    return metrics
