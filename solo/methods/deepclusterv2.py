"""DeepClusterV2 (Caron et al., 2020, with SwAV): k-means over a memory bank of every sample's embedding gives each
sample its clusters; the next epoch learns to predict them from the sample's views."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch
import torch.nn.functional as F

from solo.errors import ConfigError, DataError
from solo.losses import deepcluster_loss
from solo.methods.base import DSEOption, KoLeoOption, Method, encode_views, mlp, register_method
from solo.methods.memory_banks import MemoryBank, kmeans
from solo.schema import AT_LEAST_ONE, POSITIVE, ruled


@dataclass
class DeepClusterV2Config(DSEOption, KoLeoOption):
    name: str = "deepclusterv2"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    num_prototypes: List[int] = field(default_factory=lambda: [3000, 3000, 3000])  # one k-means per entry, its k
    temperature: float = ruled(0.1, POSITIVE)
    kmeans_iterations: int = ruled(10, AT_LEAST_ONE)


@register_method("deepclusterv2", schema=DeepClusterV2Config)
class DeepClusterV2(Method):
    """At the end of every epoch, one k-means per entry of method.num_prototypes, the h-th over the bank's embeddings of
    view h mod 2, fixes the centroids (the prototypes, not trained) and every sample's cluster for the next epoch. The
    first epoch fills the bank and has no loss. The bank (solo.methods.memory_banks.MemoryBank) holds the whole data set's
    embeddings on every rank; k-means splits its work over the ranks (solo.methods.memory_banks.kmeans)."""

    augmentations = {"digits": "digits", "natural": "multicrop_swav"}

    def __init__(self, backbone, feature_dim: int, cfg: DeepClusterV2Config):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        if not cfg.num_prototypes or min(cfg.num_prototypes) < 1:
            raise ConfigError(
                f"method.num_prototypes={cfg.num_prototypes}: give one k >= 1 per clustering, e.g. [3000, 3000, 3000]"
            )
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.cfg = cfg
        for h, k in enumerate(cfg.num_prototypes):
            self.register_buffer(f"centroids_{h}", torch.zeros(k, cfg.proj_output_dim))

    def set_data(self, num_samples: int) -> None:
        most = max(self.cfg.num_prototypes)
        if most > num_samples:
            raise ConfigError(
                f"method.num_prototypes={self.cfg.num_prototypes}: k-means cannot make {most} clusters of the "
                f"{num_samples} samples in the memory bank (the train split); lower method.num_prototypes"
            )
        self.bank = MemoryBank(num_samples, 2, self.cfg.proj_output_dim)
        self.register_buffer(
            "assignments", torch.full((len(self.cfg.num_prototypes), num_samples), -1, dtype=torch.long)
        )

    def encode(self, batch: dict) -> dict:
        # SwAV's multi-crop forward (the same official code): the crops of one size share their BatchNorm statistics.
        return self.encode_backbone(batch["views"], per_view_statistics=False)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features = encoded["features"]
        projected = encode_views(self.projector, features, per_view_statistics=False)  # every crop at once, as SwAV
        z = [F.normalize(e, dim=1) for e in projected]
        both, index = torch.cat(z), batch["index"]
        scores = [both @ getattr(self, f"centroids_{h}").T for h in range(len(self.cfg.num_prototypes))]
        loss = deepcluster_loss(scores, list(self.assignments[:, index].repeat(1, 2)), self.cfg.temperature)
        self.bank.store(index, z)
        return self.view_outputs(loss, features, batch, encoded.get("dense"))

    def prepare_step(self, index: int, total_steps: int) -> None:
        done = index + 1  # an epoch's last step clusters its bank, for the next epoch (none after the run's last)
        self.cluster_after = (
            done // self.steps_per_epoch if done % self.steps_per_epoch == 0 and done < total_steps else None
        )

    def after_optimizer_step(self) -> None:
        if (
            getattr(self, "cluster_after", None) is not None
        ):  # k-means reads the host: once an epoch, not compiled whole
            self.cluster(epoch=self.cluster_after)

    @torch.no_grad()
    def cluster(self, epoch: int) -> None:
        filled = self.bank.filled.nonzero().squeeze(1)
        for h, k in enumerate(self.cfg.num_prototypes):
            if k > len(filled):
                raise DataError(
                    f"method.num_prototypes={self.cfg.num_prototypes}: an epoch filled {len(filled)} entries "
                    f"of the memory bank, fewer than k={k}; lower method.num_prototypes"
                )
            centroids, assigned = kmeans(
                self.bank.rows[h % 2, filled], k, self.cfg.kmeans_iterations, seed=epoch * 1000 + h
            )
            getattr(self, f"centroids_{h}").copy_(centroids)
            self.assignments[h, filled] = assigned
