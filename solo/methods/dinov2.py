"""DINOv2 (Oquab et al., 2023): DINO's self-distillation of the class token over multi-crop views, iBOT's
distillation of masked patch tokens, Sinkhorn-Knopp centring of the teacher, and the KoLeo regulariser, on a Vision
Transformer. Without KoLeo (`method.koleo_weight=0`) it is iBOT with DINOv2's centring."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn as nn

from solo.backbones.vit import (
    check_vit,
    first_positions,
    grid_shape,
    output_tokens,
    patch_size,
    pool_patch_tokens,
    take,
)
from solo.data.views.batch_spec import BatchSpec, ViewBoxes
from solo.data.views.masks import BlockMask
from solo.data.views.transforms import view_sizes
from solo.distributed import all_reduce, world_size
from solo.errors import ConfigError
from solo.losses import (
    centred_softmax,
    dino_center,
    dino_cross_entropy,
    gram_loss,
    ibot_patch_loss,
    koleo_loss,
    masked_center,
    patch_kernel_alignment_loss,
    sinkhorn,
)
from solo.methods.base import DSEOption, dse_term, ema_update, encode_views, make_teacher, register_method
from solo.methods.dino import DINOHead, SelfDistillation
from solo.methods.local import in_image_orientation, resampled_over
from solo.methods.masked_image import MaskedViT
from solo.schema import AT_LEAST_ONE, FRACTION, MOMENTUM, NON_NEGATIVE, POSITIVE, PROBABILITY, choices, ruled

# How the teacher's scores become targets (DINOv2's `train.centering`): Sinkhorn-Knopp over the global batch, or DINO's
# softmax of the scores minus a running centre (one for the class tokens, one for the masked patches, as iBOT's).
Centering = choices("Centering", "sinkhorn_knopp", "centering")


@dataclass
class DINOv2Config(DSEOption):  # DSE on the student's patch tokens of the global crops
    name: str = "dinov2"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    bottleneck_dim: int = ruled(256, AT_LEAST_ONE)
    num_prototypes: int = ruled(65536, AT_LEAST_ONE)  # one head for the class token and the patches (DINOv2's default)
    # 0: the patches share the class token's prototypes; N: the patches take N of their own after the shared MLP
    # (iBOT's head without shared_head)
    patch_prototypes: int = ruled(0, NON_NEGATIVE)
    use_bn_in_head: bool = False  # BatchNorm after the head's hidden layers, over the global batch (as DINO's)
    student_temperature: float = ruled(0.1, POSITIVE)
    teacher_temperature: float = ruled(0.07, POSITIVE)  # after the warm-up
    warmup_teacher_temperature: float = ruled(0.04, POSITIVE)
    warmup_teacher_temperature_epochs: float = ruled(30.0, NON_NEGATIVE)
    centering: Centering = Centering("sinkhorn_knopp")
    sinkhorn_iterations: int = ruled(3, AT_LEAST_ONE)
    center_momentum: float = ruled(0.9, MOMENTUM)  # centering's running centres
    ibot_weight: float = ruled(1.0, NON_NEGATIVE)
    koleo_weight: float = ruled(0.1, NON_NEGATIVE)
    mask_probability: float = ruled(0.5, PROBABILITY)  # the share of global crops that are masked
    mask_ratio_min: float = ruled(0.1, FRACTION)  # a masked crop hides a share of its patches in [min, max]
    mask_ratio_max: float = ruled(0.5, FRACTION)
    base_momentum: float = ruled(0.992, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)
    freeze_last_layer_epochs: float = ruled(1.0, NON_NEGATIVE)
    # DINOv3's Gram anchoring: the weight of the Gram loss (0: off), which pulls the pairwise cosines of each global
    # crop's patch tokens towards those of an anchor, a frozen copy of the EMA teacher's backbone taken after step
    # gram_start and again every gram_refresh steps (DINOv3's ViT-7B: from step 1,010,000, every 10,000, weight 2).
    gram_anchor: float = ruled(0.0, NON_NEGATIVE)
    gram_start: int = ruled(10000, AT_LEAST_ONE)
    gram_refresh: int = ruled(10000, AT_LEAST_ONE)
    # PaKA's patch kernel alignment (DINOv3.1's post-training loss): the weight (0: off) of 1 - CKA between the linear
    # kernels of each global crop's patch tokens, the student's (masked ones too) and the EMA teacher's.
    paka_weight: float = ruled(0.0, NON_NEGATIVE)
    # PaKA's own views, as LightlyTrain's DINOv3.1 (0: the global crops' tokens, student's and teacher's, as above):
    # the augmentation's last 2 + paka_locals views are the global crops' clean renders (the teacher's) and local
    # crops drawn inside them (the student's; the first half inside global crop 0, the rest inside 1), each local's
    # tokens against its global's aligned onto its grid, both through a 3-layer head of their own (the teacher's an EMA).
    paka_locals: int = ruled(0, NON_NEGATIVE)

    def validate(self) -> None:
        if self.paka_locals and (self.paka_locals % 2 or not self.paka_weight):
            raise ValueError(
                f"paka_locals={self.paka_locals}: PaKA's local crops, half inside each global crop, for "
                f"paka_weight > 0 (paka_weight={self.paka_weight}); give an even number and a weight"
            )
        if self.mask_ratio_min > self.mask_ratio_max:
            raise ValueError(
                f"mask_ratio_min={self.mask_ratio_min} is above mask_ratio_max={self.mask_ratio_max}: a masked crop "
                "hides a share of its patches between the two"
            )


def per_token(head_levels, crops: list[torch.Tensor]) -> list[torch.Tensor]:
    """The head's levels on every token of the crops' (B, N, D), stacked: one row per token, so BatchNorm1d normalises
    features, not positions. Returns one (crops x B, N, K) per level."""
    tokens = torch.cat(crops)
    return [s.unflatten(0, tokens.shape[:2]) for s in head_levels(tokens.flatten(0, 1))]


@register_method("dinov2", schema=DINOv2Config)
class DINOv2(MaskedViT, SelfDistillation):
    """The student sees every crop, its global crops with the masked patches' embeddings replaced by a learnt mask
    token; the teacher (an EMA of backbone and head) sees the global crops whole. Losses: the cross-entropy of the
    student's class tokens against the teacher's Sinkhorn-Knopp targets of the other global crops (DINO), the same for
    each masked patch against the teacher's token at that position, averaged per image (iBOT), and KoLeo on the
    student's global class tokens. Every statistic is over the global batch."""

    augmentations = {"digits": "digits_mild", "natural": "multicrop_dinov2"}

    local_crops = True
    pool = "mean"  # DINOv2's linear protocol adds the patch tokens' mean; alone it probes best on the digits
    sync_teacher_batchnorm = True  # the teacher head's BatchNorms (use_bn_in_head) see the global batch

    def __init__(self, backbone, feature_dim: int, cfg: DINOv2Config):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        pool_patch_tokens(backbone)
        self.cfg = cfg
        self.head = self.build_head(feature_dim, cfg)
        self.mask_token = nn.Parameter(torch.zeros(backbone.embed_dim))
        self.teacher = make_teacher(nn.ModuleList([backbone, self.head]))
        if cfg.gram_anchor:  # a module and a buffer: a checkpoint holds the anchor and whether one was taken yet
            self.gram_teacher = make_teacher(backbone)
            self.register_buffer("gram_anchored", torch.tensor(False))
            self.anchored = None  # gram_anchored, read on the host once (after a resume's load), then kept here
        self.register_schedules(cfg)
        if cfg.dse_weight:
            self.draws = None  # the trainer's (solo.backbones.stochastic.Draws.attach): DSE's k-means++ draws of a step
        if cfg.paka_locals:  # LightlyTrain's PaKA head: 3 layers with GELU, no BatchNorm; the teacher's an EMA
            h = cfg.proj_hidden_dim
            self.paka_head = nn.Sequential(
                nn.Linear(feature_dim, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, cfg.bottleneck_dim)
            )
            self.paka_teacher = make_teacher(self.paka_head)
        if cfg.centering == "centering":  # buffers: a resumed run goes on with the same centres (every level's)
            self.register_buffer("center", torch.zeros(sum(self.head.out_dims)))
            self.register_buffer("patch_center", torch.zeros(sum(self.head.patch_out_dims)))

    @classmethod
    def paka_views(cls, view_sizes: list[int]) -> int:
        """How many of the views at the end are PaKA's (method.paka_locals): from the first global-sized view after
        the global crops, two clean renders and the local crops drawn inside the global crops; 0 without them."""
        later = [i for i, size in enumerate(view_sizes) if i >= cls.num_views and size == view_sizes[0]]
        return len(view_sizes) - later[0] if later else 0

    @classmethod
    def check_data(cls, view_sizes: list[int], dataset) -> None:
        super().check_data(view_sizes[: len(view_sizes) - cls.paka_views(view_sizes)], dataset)

    @classmethod
    def check_config(cls, cfg) -> None:
        sizes = view_sizes(cfg.augmentation.views, cfg.data.image_size)
        tail, locals_ = cls.paka_views(sizes), cfg.method.get("paka_locals", 0)
        if tail != (2 + locals_ if locals_ else 0) or (tail and max(sizes[-locals_:]) >= sizes[0]):
            raise ConfigError(
                f"method.paka_locals={locals_}: the augmentation's views (sizes {sizes}) end with "
                f"{'nothing of PaKA' if not tail else f'{tail} views from a global-sized one'}; PaKA's own views are the "
                "global crops' 2 clean renders (shift_of, max_shift 0) and paka_locals smaller crops inside them "
                "(inside_of), last (augmentation=multicrop_dinov31 / dinov31_digits)"
            )

    def build_head(self, feature_dim: int, cfg: DINOv2Config) -> nn.Module:
        return DINOHead(
            feature_dim,
            cfg.proj_hidden_dim,
            cfg.bottleneck_dim,
            cfg.num_prototypes,
            cfg.use_bn_in_head,
            cfg.patch_prototypes,
        )

    def head_levels(self, head: nn.Module, x: torch.Tensor, patches: bool = False) -> list[torch.Tensor]:
        """The head's scores of the rows of `x`, one tensor per nesting level: DINOv2's head has one."""
        return [head(x, patches=patches)]

    def mask_generator(self) -> BlockMask:
        c = self.cfg
        return BlockMask(
            grid_shape(self.backbone), self.num_views, c.mask_probability, c.mask_ratio_min, c.mask_ratio_max
        )

    def encode(self, batch: dict) -> dict:
        views, masks = batch["views"], batch["mask"]  # masks: (B, global crops, patches)
        vit, prefix = self.backbone, self.backbone.num_prefix_tokens
        if len(views) > self.num_views and not vit.dynamic_img_size:
            raise ConfigError(
                "method=dinov2 runs the smaller local crops through the ViT: set backbone.kwargs.dynamic_img_size=true "
                "(timm then resizes its position embeddings to each crop)"
            )
        hidden, crops, crop_masks = self.mask_generator().hidden, views[: self.num_views], list(masks.unbind(1))
        student = encode_views(
            vit, crops, crop_masks, forward=lambda x, mask: output_tokens(vit, x, mask, self.mask_token)
        )
        with torch.no_grad():
            teacher = encode_views(self.teacher[0], crops, forward=partial(output_tokens, self.teacher[0]))
        cls, patches, teacher_cls, teacher_patches = [], [], [], []
        for tokens, teacher_tokens, mask in zip(student, teacher, crop_masks):
            positions = first_positions(mask, hidden)  # the masked patches first: iBOT's candidates
            cls.append(tokens[:, 0])
            patches.append(take(tokens[:, prefix:], positions))
            teacher_cls.append(teacher_tokens[:, 0])
            teacher_patches.append(take(teacher_tokens[:, prefix:], positions))
        paka_views = 2 + self.cfg.paka_locals if self.cfg.paka_locals else 0
        local_crops = views[self.num_views : len(views) - paka_views]
        cls += [tokens[:, 0] for tokens in encode_views(vit, local_crops, forward=partial(output_tokens, vit))]
        encoded = {"cls": cls, "patches": patches, "teacher_cls": teacher_cls, "teacher_patches": teacher_patches}
        if self.cfg.gram_anchor and self.is_anchored():  # every patch of the global crops, masked ones too (DINOv3's)
            encoded["gram"] = [tokens[:, prefix:] for tokens in student]
            with torch.no_grad():
                anchor = encode_views(self.gram_teacher, crops, forward=partial(output_tokens, self.gram_teacher))
            encoded["gram_anchor"] = [tokens[:, prefix:] for tokens in anchor]
        if self.cfg.paka_locals:
            encoded["paka"], encoded["paka_teacher"] = self.paka_tokens(views[len(views) - paka_views :], batch)
        elif self.cfg.paka_weight:
            encoded["paka"] = [tokens[:, prefix:] for tokens in student]
            encoded["paka_teacher"] = [tokens[:, prefix:] for tokens in teacher]
        if self.cfg.dse_weight:  # every patch of the global crops, masked ones too
            encoded["dse"] = [tokens[:, prefix:] for tokens in student]
        return encoded | self.probe_features(batch)

    def batch_spec(self) -> BatchSpec:
        spec = super().batch_spec()
        if not self.cfg.paka_locals:
            return spec
        return replace(spec, fields=(*spec.fields, ViewBoxes()))

    def paka_tokens(self, views: list[torch.Tensor], batch: dict) -> tuple[list, list]:
        """PaKA's pairs, as LightlyTrain's DINOv3.1: each local crop's student tokens, in the image's orientation, and
        the EMA teacher's tokens of the clean render of the global crop it lies inside, resampled over the local's box
        onto its grid (solo.methods.local.resampled_over). `views`: the 2 clean renders, then the local crops."""
        vit, prefix, half = self.backbone, self.backbone.num_prefix_tokens, self.cfg.paka_locals // 2
        boxes = batch["view_boxes"][:, -len(views) :]  # (B, 2 + locals, 5)

        def maps(tokens: torch.Tensor, side: int) -> torch.Tensor:  # (B, D, side, side)
            return tokens[:, prefix:].mT.unflatten(2, (side, side))

        with torch.no_grad():
            clean = encode_views(self.teacher[0], views[:2], forward=partial(output_tokens, self.teacher[0]))
        students, teachers = [], []
        for j, tokens in enumerate(encode_views(vit, views[2:], forward=partial(output_tokens, vit))):
            side, parent, box = views[2 + j].shape[-1] // patch_size(vit), j // half, boxes[:, 2 + j]
            students.append(in_image_orientation(maps(tokens, side), box).flatten(2).mT)
            with torch.no_grad():
                whole = maps(clean[parent], views[parent].shape[-1] // patch_size(vit))
                teachers.append(resampled_over(whole, boxes[:, parent], box, (side, side)).flatten(2).mT)
        return students, teachers

    def patch_temperature(self) -> torch.Tensor:
        """The teacher's temperature for the masked patches' targets: the class token's (iBOT: its own schedule)."""
        return self.teacher_temperature

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        c, temperature, patch_temperature = self.cfg, self.teacher_temperature, self.patch_temperature()
        # per crop, per level; the crops' class tokens through one call (encode_views: each crop its BatchNorm group)
        student = encode_views(self.head, encoded["cls"], forward=partial(self.head_levels, self.head))
        with torch.no_grad():
            teacher_head = self.teacher[1]
            scores = self.head_levels(teacher_head, torch.cat(encoded["teacher_cls"]))
            patch_scores = per_token(partial(self.head_levels, teacher_head, patches=True), encoded["teacher_patches"])
            hidden = self.mask_generator().hidden  # which of each image's candidate patches are masked
            valid = torch.cat([m.gather(1, first_positions(m, hidden)) for m in batch["mask"].unbind(1)])
            if c.centering == "sinkhorn_knopp":
                targets = [sinkhorn(s, temperature, c.sinkhorn_iterations) for s in scores]
                patch_targets = [
                    sinkhorn(s.flatten(0, 1), patch_temperature, c.sinkhorn_iterations, valid=valid.flatten()).view(
                        s.shape
                    )
                    for s in patch_scores
                ]
            else:
                centers = self.center.split(self.head.out_dims)
                patch_centers = self.patch_center.split(self.head.patch_out_dims)
                targets = [centred_softmax(s, m, temperature) for s, m in zip(scores, centers)]
                patch_targets = [centred_softmax(s, m, patch_temperature) for s, m in zip(patch_scores, patch_centers)]
                # after the targets, from this step's whole batch: the next step's centres
                self.center.copy_(dino_center([torch.cat(scores, dim=-1)], self.center, c.center_momentum))
                self.patch_center.copy_(
                    masked_center(
                        torch.cat(patch_scores, dim=-1).flatten(0, 1),
                        valid.flatten(),
                        self.patch_center,
                        c.center_momentum,
                    )
                )
        # Each level's loss, summed over the levels (unweighted, as Franca's code). tensor_split, not split(n): split(0)
        # of an empty rank's targets gives one piece, not one per crop.
        terms = {
            "dino": sum(
                dino_cross_entropy(
                    [crop[i] for crop in student], list(t.tensor_split(self.num_views)), c.student_temperature
                )
                for i, t in enumerate(targets)
            )
        }
        if c.ibot_weight:
            student_patches = per_token(partial(self.head_levels, self.head, patches=True), encoded["patches"])
            terms["ibot"] = sum(
                ibot_patch_loss(s, t, valid, c.student_temperature) for s, t in zip(student_patches, patch_targets)
            )
        if c.koleo_weight:
            terms["koleo"] = sum(koleo_loss(x) for x in encoded["cls"][: self.num_views])
        if "gram" in encoded:
            terms["gram"] = gram_loss(torch.cat(encoded["gram"]), torch.cat(encoded["gram_anchor"]))
        if c.paka_weight:
            student_tokens, teacher_tokens = torch.cat(encoded["paka"]), torch.cat(encoded["paka_teacher"])
            if c.paka_locals:  # after the alignment: the heads are not linear
                student_tokens = self.paka_head(student_tokens)
                with torch.no_grad():
                    teacher_tokens = self.paka_teacher(teacher_tokens)
            terms["paka"] = patch_kernel_alignment_loss(student_tokens, teacher_tokens)
        if c.dse_weight:
            terms["dse"] = dse_term(self, encoded["dse"], c)
        weights = {
            "dino": 1.0,
            "ibot": c.ibot_weight,
            "koleo": c.koleo_weight,
            "gram": c.gram_anchor,
            "paka": c.paka_weight,
            "dse": c.dse_weight,
        }
        loss = sum(weights[name] * term for name, term in terms.items())
        self.terms = {name: term.detach() for name, term in terms.items()}  # W times this rank's share
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}

    def is_anchored(self) -> bool:
        if self.anchored is None:
            self.anchored = bool(self.gram_anchored)
        return self.anchored

    def prepare_step(self, index: int, total_steps: int) -> None:
        super().prepare_step(index, total_steps)
        c, done = self.cfg, index + 1  # the steps done after this one
        self.refresh_anchor = c.gram_anchor and done >= c.gram_start and (done - c.gram_start) % c.gram_refresh == 0

    def after_optimizer_step(self) -> None:
        super().after_optimizer_step()
        if self.cfg.paka_locals:
            ema_update(self.paka_teacher, self.paka_head, self.ema_momentum())
        if getattr(self, "refresh_anchor", False):  # after this step's EMA update
            ema_update(self.gram_teacher, self.teacher[0], 0.0)  # momentum 0: the EMA teacher's backbone, copied
            self.gram_anchored.fill_(True)
            self.anchored = True

    def metrics(self) -> dict[str, torch.Tensor]:
        return {**super().metrics(), **self._last_terms()}

    def _last_terms(self) -> dict[str, torch.Tensor]:
        """The last step's loss terms over the global batch (every rank logs: the sum over ranks is W times each)."""
        terms = getattr(self, "terms", {})
        if not terms:
            return {}
        values = all_reduce(torch.stack(list(terms.values())).double()) / world_size()
        return {f"train/{name}_loss": value for name, value in zip(terms, values)}
