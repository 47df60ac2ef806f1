"""Pure, distributed-aware loss functions: in a process group each computes the loss of the global batch."""

from solo.losses._checks import NonFiniteError
from solo.losses.barlow_twins import barlow_twins_loss
from solo.losses.contrastive import clip_loss, nt_xent_loss
from solo.losses.registry import LOSSES

__all__ = ["LOSSES", "NonFiniteError", "barlow_twins_loss", "clip_loss", "nt_xent_loss"]
