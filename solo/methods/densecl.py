"""DenseCL (Wang, Zhang, Shen, Kong and Li, 2021, "Dense Contrastive Learning for Self-Supervised Visual
Pre-Training"): MoCo v2 with a second, dense head. Besides the query view's pooled embedding against the momentum
encoder's key of the other view, each cell of the query's feature map is contrasted with the key's cell most like it
(matched on the backbones' own features), both against queues of earlier steps' keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones import pooled_and_map, watch_map
from solo.losses import co2_loss, moco_queue_loss
from solo.methods.base import CO2Option, DSEOption, Method, ema_update, make_teacher, register_method
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, FRACTION, POSITIVE, PROBABILITY, ruled


@dataclass
class DenseCLConfig(CO2Option, DSEOption):  # CO2 on the global branch, as MoCo v2+'s with its queue
    name: str = "densecl"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # earlier keys in each queue (pooled, dense); at least a global batch
    temperature: float = ruled(0.2, POSITIVE)
    dense_weight: float = ruled(0.5, FRACTION)  # the dense loss's share of the loss (the code's loss_lambda)
    momentum: float = ruled(0.999, PROBABILITY)  # the momentum encoder's share in its EMA update (constant)


def matched_cells(query_map: torch.Tensor, key_map: torch.Tensor) -> torch.Tensor:
    """(B, cells): for each cell of each query map, the index of the key map's cell of the same image whose backbone
    feature is the most similar in cosine (DenseCL's correspondence). Maps: (B, C, h, w)."""
    query, key = F.normalize(query_map.flatten(2), dim=1), F.normalize(key_map.flatten(2), dim=1)
    return torch.einsum("bcq,bck->bqk", query, key).argmax(dim=2)


@register_method("densecl", schema=DenseCLConfig)
class DenseCL(Method):
    """The first view is the query, the second the key (the official code is not symmetric). The backbone gives each
    view's pooled features and the map they pool (solo.backbones.pooled_and_map); the global head (MoCo v2's MLP)
    embeds the pooled features, the dense head (the same MLP as 1 x 1 convolutions) each cell of the map. The momentum
    encoder is a copy of the backbone and both heads. Loss: (1 - dense_weight) x MoCo v2's InfoNCE of the pooled
    embeddings + dense_weight x the same of every query cell against its matched key cell (`matched_cells`), each
    averaged over the global batch's images or cells (solo.losses.moco_queue_loss); the negatives: the global queue of
    earlier keys, and the dense queue of earlier keys' mean dense embeddings (solo.methods.memory_banks.GlobalQueue).
    With `co2_weight`, plus that times CO2's consistency of the pooled query and key over the global queue (not in the
    paper; as MoCo v2+'s). The probe reads the query view's pooled features."""

    teachers = ("teacher",)
    sync_teacher_batchnorm = True
    augmentations = {"digits": "digits", "natural": "mocov2"}

    def __init__(self, backbone, feature_dim: int, cfg: DenseCLConfig):
        super().__init__(backbone, feature_dim)
        watch_map(backbone)  # before the teacher is copied from it: each reads its own map
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        self.global_head = nn.Sequential(nn.Linear(feature_dim, h), nn.ReLU(inplace=True), nn.Linear(h, d))
        for layer in self.global_head[::2]:  # the code's init_linear="kaiming" (its convolutions keep torch's init)
            nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(layer.bias)
        self.dense_head = nn.Sequential(nn.Conv2d(feature_dim, h, 1), nn.ReLU(inplace=True), nn.Conv2d(h, d, 1))
        self.teacher = make_teacher(nn.ModuleList([backbone, self.global_head, self.dense_head]))
        self.queues = nn.ModuleList([GlobalQueue(cfg.queue_size, d) for _ in ("pooled", "dense")])
        self.cfg = cfg
        self.take_regularisers(cfg)
        self.momentum = cfg.momentum
        self.register_buffer("teacher_momentum", torch.tensor(cfg.momentum), persistent=False)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)

    def encode(self, batch: dict) -> dict:
        query, key = batch["views"]
        pooled, query_map = pooled_and_map(self.backbone, query)
        with torch.no_grad():
            key_pooled, key_map = pooled_and_map(self.teacher[0], key)
        return {"features": pooled, "query_map": query_map, "key_pooled": key_pooled, "key_map": key_map}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        pooled, query_map, key_map = encoded["features"], encoded["query_map"], encoded["key_map"]
        q = self.global_head(pooled)
        q_cells = self.dense_head(query_map).flatten(2)  # (B, d, cells)
        with torch.no_grad():
            k = self.teacher[1](encoded["key_pooled"])
            k_cells = self.teacher[2](key_map).flatten(2)
            matched = matched_cells(query_map, key_map)
            k_matched = k_cells.gather(2, matched[:, None].expand(-1, k_cells.shape[1], -1))
        # Copies: the loss's backward needs the rows as they were before this step's push.
        rows, valid = [queue.rows.clone() for queue in self.queues], [queue.valid() for queue in self.queues]
        t, w = self.cfg.temperature, self.cfg.dense_weight
        pooled_loss = moco_queue_loss(q, k, rows[0], valid[0], t)
        dense_loss = moco_queue_loss(q_cells.mT.flatten(0, 1), k_matched.mT.flatten(0, 1), rows[1], valid[1], t)
        loss = (1 - w) * pooled_loss + w * dense_loss
        if self.cfg.co2_weight:
            loss = loss + self.cfg.co2_weight * co2_loss(q, k, rows[0], valid[0], self.cfg.co2_temperature)
        self.queues[0].push(F.normalize(k, dim=1))
        self.queues[1].push(F.normalize(k_cells.mean(dim=2), dim=1))
        return self.view_outputs(loss, [pooled], batch, [query_map.flatten(2).mT])

    def after_optimizer_step(self) -> None:
        ema_update(self.teacher, nn.ModuleList([self.backbone, self.global_head, self.dense_head]), self.ema_momentum())
