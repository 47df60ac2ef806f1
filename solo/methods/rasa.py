"""RASA (Franca, Venkataramanan et al., 2025), post-training that removes the absolute position from a trained ViT's
patch tokens. The backbone is frozen. A linear regressor with a sigmoid learns each patch's place in the grid from its
token (the squared error to the row and column, each in [0, 1]); the plane its two weight rows span is then projected
out of the tokens, and the next stage learns the position that is left, `method.stages` times. The projections end up
in the backbone as `norm.removal` (backbone.remove_positions), so the run's backbone is the one to use."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from solo.backbones.stochastic import without_randomness
from solo.backbones.vit import (
    check_vit,
    embed_patches,
    pool_patch_tokens,
    prefix_tokens,
    removes_positions,
    run_blocks,
)
from solo.errors import ConfigError
from solo.losses import position_loss
from solo.methods.base import Method, register_method
from solo.schema import AT_LEAST_ONE, ruled

# What the digits recipe post-trains unless trainer.init_from says otherwise: the zoo's Franca ViT.
DIGITS_START = "franca-digits-vittiny6"


@dataclass
class RASAConfig:
    name: str = "rasa"
    # Planes removed one after the other, each learnt over an equal share of the run's steps (the official code's 9).
    stages: int = ruled(9, AT_LEAST_ONE)


def plane_projection(weight: torch.Tensor) -> torch.Tensor:
    """(D, D): the map x -> x - <x, u_r> u_r - <x, u_c> u_c of row vectors, u_r and u_c the Gram-Schmidt basis of the
    regressor's two weight rows (the official RASAHead.decompose_pos_2D). Rows that are zero (a stage that has not
    learnt) remove nothing."""
    row = F.normalize(weight[0], dim=0)  # F.normalize leaves a zero row zero
    column = F.normalize(weight[1] - (weight[1] @ row) * row, dim=0)
    basis = torch.stack([row, column])
    return torch.eye(len(row), dtype=weight.dtype, device=weight.device) - basis.T @ basis


def grid_positions(height: int, width: int) -> torch.Tensor:
    """(H W, 2): each patch's row and column in raster order, each scaled to [0, 1] (the official targets)."""
    rows = torch.arange(height, dtype=torch.float64) / max(height - 1, 1)
    columns = torch.arange(width, dtype=torch.float64) / max(width - 1, 1)
    return torch.cartesian_prod(rows, columns)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@register_method("rasa", schema=RASAConfig)
class RASA(Method):
    """One view per image through the frozen backbone. Stage k of `stages` trains `regressor` (2 x D, no bias; zero at
    each stage's start) on the patch tokens after the norm and the k earlier stages' projections (`removed_before`,
    composed into one D x D map). Before the first step of stage k + 1 (prepare_step) the regressor's plane joins
    `removed_before`. After every optimizer update the backbone's `norm.removal` becomes `removed_before` and the
    current regressor's plane: what the official head removes when it uses its prediction layer too. The probe reads
    the backbone as it stands: the mean patch token, positions removed."""

    num_views = 1
    pool = "mean"
    augmentations = {"digits": "one_view_digits", "natural": "mae"}

    @classmethod
    def choose_for_the_data(cls, cfg) -> list[str]:
        said = []
        if "remove_positions" in cfg.backbone and not cfg.backbone.remove_positions:
            cfg.backbone.remove_positions = True
            said.append("backbone.remove_positions=true: the removal that method=rasa learns")
        if cfg.trainer.init_from is None:
            if cfg.data.name != "digits":
                raise ConfigError(
                    "trainer.init_from is unset, and method=rasa post-trains a backbone: name the run, zoo entry or "
                    "weights file to start from (trainer.init_from=<run dir | zoo name | .safetensors>)"
                )
            cfg.trainer.init_from = DIGITS_START
            said.append(
                f"trainer.init_from={DIGITS_START}: the digits' Franca backbone, which method=rasa post-trains "
                "(a run, zoo name or weights file chooses another)"
            )
        return said

    def __init__(self, backbone, feature_dim: int, cfg: RASAConfig):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        if not removes_positions(backbone):
            raise ConfigError(
                "method=rasa learns the removal that backbone.remove_positions=true gives the ViT, and it is false: "
                "leave it true (the method's default)"
            )
        pool_patch_tokens(backbone)
        without_randomness(backbone).requires_grad_(False)
        self.stages = cfg.stages
        width = backbone.embed_dim
        self.regressor = nn.Linear(width, 2, bias=False)
        nn.init.zeros_(self.regressor.weight)
        self.register_buffer("removed_before", torch.eye(width))
        self.register_buffer("positions", grid_positions(*backbone.patch_embed.grid_size), persistent=False)

    def set_schedule(self, steps_per_epoch: int, total_steps: int) -> None:
        super().set_schedule(steps_per_epoch, total_steps)
        if total_steps < self.stages:
            raise ConfigError(
                f"method.stages={self.stages}: the run has {total_steps} steps, fewer than one per stage; lower "
                "method.stages or train longer"
            )
        self.steps_per_stage = total_steps // self.stages

    def encode(self, batch: dict) -> dict:
        images = batch["views"][0]
        vit = self.backbone
        with torch.no_grad():
            tokens = torch.cat([prefix_tokens(vit, len(images)), embed_patches(vit, images)], dim=1)
            tokens = run_blocks(vit, tokens, final_norm=False)
            patches = vit.norm(tokens, keep_positions=True)[:, vit.num_prefix_tokens :] @ self.removed_before
        encoded = {"predicted": torch.sigmoid(self.regressor(patches))}
        if self.feeds_probe:
            with torch.no_grad():
                encoded["features"] = vit.forward_head(vit.norm(tokens))
        return encoded

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        loss = position_loss(encoded["predicted"], self.positions.to(encoded["predicted"].dtype))
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}

    @torch.no_grad()
    def prepare_step(self, index: int, total_steps: int) -> None:
        stage, into = divmod(index, self.steps_per_stage)
        if into == 0 and 0 < stage < self.stages:  # the previous stage's plane is removed from here on
            self.removed_before.copy_(self.removed_before @ plane_projection(whole(self.regressor.weight)))
            self.regressor.weight.zero_()

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        removal = self.removed_before @ plane_projection(whole(self.regressor.weight))
        self.backbone.norm.removal.copy_(removal)
