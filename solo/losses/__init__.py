"""Pure, distributed-aware loss functions: in a process group each computes the loss of the global batch."""

from solo.losses._checks import NonFiniteError
from solo.losses.barlow_twins import all4one_feature_loss, barlow_twins_loss
from solo.losses.capi import capi_clustering, capi_loss
from solo.losses.checked import LOSSES
from solo.losses.contrastive import (
    align_uniform_loss,
    clip_loss,
    dcl_loss,
    directclr_loss,
    nnclr_loss,
    nt_xent_loss,
    supcon_loss,
)
from solo.losses.detcon import detcon_loss
from solo.losses.distill import feature_distillation_loss
from solo.losses.emp_ssl import emp_ssl_loss
from solo.losses.frossl import frossl_loss
from solo.losses.koleo import koleo_loss
from solo.losses.lejepa import lejepa_loss, random_directions
from solo.losses.masked import (
    masked_patch_l1,
    masked_patch_mse,
    masked_patch_smooth_l1,
    next_patch_mse,
    normalised_patches,
)
from solo.losses.mmcr import mmcr_loss
from solo.losses.msn import msn_loss, msn_targets, power_law_prior, prototype_logits
from solo.losses.regression import byol_loss, moco_queue_loss, mocov3_loss, ressl_loss, simsiam_loss
from solo.losses.self_distillation import (
    centred_softmax,
    deepcluster_loss,
    dino_center,
    dino_cross_entropy,
    dino_loss,
    gram_loss,
    ibot_patch_loss,
    masked_center,
    sinkhorn,
    swav_loss,
)
from solo.losses.siglip import siglip_loss
from solo.losses.ssl_ey import ssl_ey_loss
from solo.losses.supervised import supervised_loss
from solo.losses.tico import tico_loss
from solo.losses.vicreg import vibcreg_loss, vicreg_loss
from solo.losses.vicregl import vicregl_loss
from solo.losses.whitening import whiten, wmse_loss

__all__ = [
    "LOSSES",
    "NonFiniteError",
    "align_uniform_loss",
    "all4one_feature_loss",
    "barlow_twins_loss",
    "byol_loss",
    "capi_clustering",
    "capi_loss",
    "centred_softmax",
    "clip_loss",
    "dcl_loss",
    "deepcluster_loss",
    "detcon_loss",
    "directclr_loss",
    "dino_center",
    "dino_cross_entropy",
    "dino_loss",
    "emp_ssl_loss",
    "feature_distillation_loss",
    "frossl_loss",
    "gram_loss",
    "ibot_patch_loss",
    "koleo_loss",
    "lejepa_loss",
    "masked_center",
    "masked_patch_l1",
    "masked_patch_mse",
    "masked_patch_smooth_l1",
    "mmcr_loss",
    "moco_queue_loss",
    "mocov3_loss",
    "msn_loss",
    "msn_targets",
    "next_patch_mse",
    "nnclr_loss",
    "normalised_patches",
    "nt_xent_loss",
    "power_law_prior",
    "prototype_logits",
    "random_directions",
    "ressl_loss",
    "siglip_loss",
    "simsiam_loss",
    "sinkhorn",
    "ssl_ey_loss",
    "supcon_loss",
    "supervised_loss",
    "swav_loss",
    "tico_loss",
    "vibcreg_loss",
    "vicreg_loss",
    "vicregl_loss",
    "whiten",
    "wmse_loss",
]
