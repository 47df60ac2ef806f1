"""Validation at the end of each epoch, and the pictures at the end of a run."""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from solo.data.decode import SkippedImages
from solo.eval.features import extract_features
from solo.eval.health import health
from solo.eval.knn import knn_accuracy
from solo.eval.plots import plot_curves, plot_embedding
from solo.eval.probe import accuracy
from solo.eval.retrieval import retrieval_metrics
from solo.eval.zero_shot import zero_shot_accuracy


class Evaluator:
    """On the val split, for image methods, from one pass of the backbone: the accuracy of its classifier
        (`Method.classifier`: the online probe) on the features, their health and that of the embeddings the loss sees
        (solo.eval.health: RankMe, uniformity, spread) and the method's own (`Method.val_health`: a distilled student's
        agreement with its teacher), a weighted k-NN and retrieval by class (solo.eval.retrieval: MAP@R, recall@k; the val
    images as queries, the train split as the gallery) when `knn_k > 0` and the data has labels; for
        image-text methods, what `evaluate` reports (retrieval, zero-shot), and zero-shot accuracy on
        trainer.zero_shot_folder's images."""

    def __init__(
        self,
        model,
        loaders,
        num_classes: int | None,
        *,
        knn_k: int,
        knn_temperature: float,
        device,
        autocast,
        skipped: SkippedImages | None,
    ):
        self.model, self.loaders, self.num_classes = model, loaders, num_classes
        self.knn_k, self.knn_temperature = knn_k, knn_temperature
        self.device, self.autocast = device, autocast
        self.skipped = skipped  # names the unreadable images left out (data.on_bad_image=skip)
        self.last_val = None  # (features, labels) of the last evaluation's pass over the val split, for the plot

    def __call__(self) -> dict:
        method, metrics = self.model.method, {}
        if self.loaders.zero_shot is not None:
            folder = zero_shot_accuracy(
                method, self.loaders.zero_shot_prompts, self.loaders.zero_shot, self.device, self.autocast
            )
            metrics |= {"val/folder_zeroshot_acc1": folder["acc1"], "val/folder_zeroshot_acc5": folder["acc5"]}
        if self.loaders.val is None:
            return metrics
        val = None
        if method.inputs == "views":  # one pass over the val split for the classifier, the health and the k-NN
            # The embedding the loss sees: the projector's output, where the method has one.
            head = getattr(method, "projector", None) or nn.Identity()
            *val, embedded = extract_features(
                method.backbone, self.loaders.val, self.device, self.autocast, head, self.skipped
            )
            self.last_val = val
            classifier = method.classifier(self.model.probe)
            if classifier is not None:
                metrics |= {f"val/{k}": v for k, v in accuracy(classifier, *val, self.device).items()}
            metrics |= health(val[0], embedded) | method.val_health(
                embedded, self.loaders.val, self.device, self.autocast
            )
        else:
            metrics |= method.evaluate(self.model.probe, self.loaders.val, self.device, self.autocast)
        if self.knn_k > 0 and self.loaders.train_eval is not None:
            train = extract_features(
                method.backbone, self.loaders.train_eval, self.device, self.autocast, skipped=self.skipped
            )
            val = val or extract_features(
                method.backbone, self.loaders.val, self.device, self.autocast, skipped=self.skipped
            )
            knn = knn_accuracy(*train, *val, self.num_classes, self.knn_k, self.knn_temperature)
            metrics |= {"val/knn_acc1": knn["acc1"], "val/knn_acc5": knn["acc5"]}
            metrics |= {f"val/retrieval_{k}": v for k, v in retrieval_metrics(*train, *val).items()}
        return metrics

    def plot(self, run_dir: Path, is_main: bool) -> None:
        """curves.png from metrics.jsonl and, with labelled val data, embedding.png of the val features: those of
        the evaluation at the end where it made them (no second pass), else extracted here."""
        val = self.loaders.val
        if val is not None and self.num_classes:
            features, labels = self.last_val or extract_features(
                self.model.method.backbone, val, self.device, self.autocast, skipped=self.skipped
            )  # all ranks
            if is_main:
                plot_embedding(
                    features.numpy(), labels.numpy(), run_dir / "embedding.png", val.dataset.classes, title=run_dir.name
                )
        if is_main and (run_dir / "metrics.jsonl").exists():
            plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
