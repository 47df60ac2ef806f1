"""All4One (Estepa et al., 2023): NNCLR's neighbour contrast, a contrast of attended neighbourhoods (a Transformer over
each sample's nearest neighbours in the support set), and a feature contrast between the momentum teacher's and the
student's embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.errors import ConfigError
from solo.losses import all4one_feature_loss, nnclr_loss
from solo.methods.base import DSEOption, KoLeoOption, MomentumTwoViewMethod, mlp, register_method
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, ruled

NEIGHBOURS = 5  # the paper's neighbourhood: the sequence the Transformer attends over


@dataclass
class All4OneConfig(DSEOption, KoLeoOption):
    name: str = "all4one"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)  # also the Transformer's width: a multiple of its 8 heads
    pred_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    queue_size: int = ruled(98304, AT_LEAST_ONE)  # the support set: earlier steps' teacher embeddings of view 1
    temperature: float = ruled(0.2, POSITIVE)
    base_momentum: float = ruled(0.99, PROBABILITY)
    final_momentum: float = ruled(1.0, PROBABILITY)


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(length, width) sine and cosine position codes (Vaswani et al., 2017), interleaved."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    codes = torch.zeros(length, width)
    codes[:, 0::2] = torch.sin(position * frequency)
    codes[:, 1::2] = torch.cos(position * frequency)[:, : width // 2]
    return codes


@register_method("all4one", schema=All4OneConfig)
class All4One(MomentumTwoViewMethod):
    """The student is backbone -> projector -> predictor (NNCLR's) plus a second predictor whose output leads the
    "query" sequence; the teacher (backbone -> projector, EMA) fills the support set. The Transformer has no dropout
    (the paper's 0.1 would draw masks that depend on how the batch is split over processes)."""

    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: All4OneConfig):
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        projector = mlp([feature_dim, h, h, d], last_bn=True)
        super().__init__(
            backbone, feature_dim, projector, mlp([d, cfg.pred_hidden_dim, d]), cfg.base_momentum, cfg.final_momentum
        )
        self.take_regularisers(cfg)
        self.predictor2 = mlp([d, cfg.pred_hidden_dim, d])
        layer = nn.TransformerEncoderLayer(d, nhead=8, dim_feedforward=2 * d, dropout=0.0, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
        self.register_buffer("positions", sinusoidal_positions(NEIGHBOURS, d), persistent=False)
        self.support = GlobalQueue(cfg.queue_size, d)
        self.temperature = cfg.temperature

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)
        if cfg.method.proj_output_dim % 8:
            raise ConfigError(
                f"method.proj_output_dim={cfg.method.proj_output_dim}: All4One's Transformer over it has 8 "
                "heads; use a multiple of 8"
            )

    def attend(self, sequence: torch.Tensor) -> torch.Tensor:
        return self.transformer(sequence + self.positions.to(sequence.dtype))[:, 0]

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        z1, z2 = self.projector(f1), self.projector(f2)
        with torch.no_grad():
            t1, t2 = (F.normalize(self.teacher[1](t), dim=1) for t in encoded["teacher"])
        nn1, nn2 = self.support.neighbours(t1, NEIGHBOURS), self.support.neighbours(t2, NEIGHBOURS)
        # Each view's own neighbourhood, and a query sequence: its second prediction followed by its 4 nearest.
        rich1, rich2 = self.attend(nn1), self.attend(nn2)
        query1, query2 = (
            self.attend(torch.cat([self.predictor2(z)[:, None], nn[:, : NEIGHBOURS - 1]], dim=1))
            for z, nn in ((z1, nn1), (z2, nn2))
        )
        attended = (nnclr_loss(rich1, query2, 0.1) + nnclr_loss(rich2, query1, 0.1)) / 2  # at solo-learn's default 0.1
        neighbour = (
            nnclr_loss(nn1[:, 0], self.predictor(z2), self.temperature)
            + nnclr_loss(nn2[:, 0], self.predictor(z1), self.temperature)
        ) / 2
        loss = 0.5 * (attended + neighbour + all4one_feature_loss(t1, t2, z1, z2))
        self.support.push(t1)
        return self.view_outputs(loss, [f1, f2], batch, encoded.get("dense"))
