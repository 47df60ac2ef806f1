"""Every method of solo's, end to end: the whole training step (teacher, centre, frozen layers included) is the same
on 1 process with batch 2b as on 2 processes with batch b, a 2-process run resumes from a mid-run checkpoint
bit-identical, and configurations a method cannot use are refused with the reason."""

import copy
import dataclasses
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import MissingConfigException

from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.losses import dse_score
from solo.methods import METHODS
from solo.train.trainer import pretrain
from tests.test_train import (
    REPO,
    TINY,
    TINY_FILES,
    compose_cfg,
    many_runs,
    metrics,
    run,
    weights,
    weights_at_init,
)

BASE = [o for o in TINY if not o.startswith("method.")] + ["trainer.precision=64"]
HEADS = ["method.proj_hidden_dim=32", "method.proj_output_dim=16"]
TEXT = ["data=digits", "method.embed_dim=16", "method.text.width=16", "method.text.depth=1", "method.text.heads=2"]
# Small heads; schedules short enough that a few steps cross them (4 steps per epoch at a global batch of 16).
# DINOv2, iBOT and Franca on timm's test ViT (width 64, 6 blocks, any crop size) on 4 px patches, small heads, a teacher
# that moves fast (momentum 0.9), the last layer frozen for half an epoch.
TINY_DINO_FAMILY = [
    "backbone.name=test_vit",
    "backbone.small_stem=false",
    "+backbone.kwargs.img_size=16",
    "+backbone.kwargs.patch_size=4",
    "augmentation=multicrop_digits",
    "method.proj_hidden_dim=32",
    "method.bottleneck_dim=16",
    "method.num_prototypes=64",
    "method.base_momentum=0.9",
    "method.warmup_teacher_temperature_epochs=1",
    "method.freeze_last_layer_epochs=0.5",
    # Not the digits recipe's AdamW: it divides each element's step by that element's own gradient scale, which
    # lifts float64 rounding in elements whose gradient is near 0 to 1.5e-10 of the movement here.
    "optim=lars",
]

METHOD = {
    "byol": HEADS + ["method.pred_hidden_dim=32", "method.base_momentum=0.9"],
    # CO2 with the global batch's other keys as the negatives (co2_batch_loss), in MoCo v3 and SimCLR.
    "mocov3": HEADS + ["method.pred_hidden_dim=32", "method.base_momentum=0.9", "method.co2_weight=1.0"],
    "simclr": HEADS + ["method.co2_weight=1.0"],
    # KoLeo (method.koleo_weight) on the backbone's features, in a method of each two-view base (and MoCo v2+'s CO2):
    # its nearest neighbours are sought in the global batch. DSE (method.dse_weight) is on in the cases of DINO
    # (multi-crop's global crops, under FSDP at W = 3 too), TiCo (one student view), VICRegL (the maps it reads),
    # I-JEPA (padded contexts), MSN (the masked anchor), DINOv2 and MAE: a case for each way a method hands its tokens
    # over (every method's tokens: test_dse_adds_its_weight_...), k-means on groups of 8 images of the global batch,
    # which span ranks.
    "vicreg": HEADS + ["method.koleo_weight=0.1"],
    "siglip": TEXT,
    # The digits CLIP zoo entry's image tower, locked (its BatchNorm on its running statistics), a tiny text tower.
    "lit": TEXT,
    # Multi-crop, which the digits recipe leaves out: 2 global 16 px crops and 4 local 8 px ones.
    "dino": [
        "augmentation=multicrop_digits",
        "method.proj_hidden_dim=32",
        "method.bottleneck_dim=16",
        "method.num_prototypes=64",
        "method.base_momentum=0.9",
        "method.warmup_teacher_temperature=0.02",
        "method.warmup_teacher_temperature_epochs=1",
        "method.freeze_last_layer_epochs=0.5",
        "method.dse_weight=0.1",  # on the global crops
    ],
    # Multi-crop, which the digits recipe leaves out: 2 global 16 px crops and 4 local 8 px ones; a queue of 32 per
    # global crop that joins the Sinkhorn-Knopp from step 2 and that the 16 rows of every step wrap.
    "swav": HEADS
    + [
        "augmentation=multicrop_digits",
        "method.num_prototypes=16",
        "method.freeze_prototypes_epochs=0.5",
        "method.queue_size=32",
        "method.queue_start_epochs=0.25",
    ],
    # A queue of 64 that the 6 steps of 16 keys wrap (96 pushed): negatives from the queue, not the batch; CO2's
    # consistency on the same negatives.
    "mocov2plus": HEADS
    + [
        "method.queue_size=64",
        "method.base_momentum=0.9",
        "method.co2_weight=1.0",
        "method.koleo_weight=0.1",
    ],
    # Queues of 32 (two global batches) that the 6 steps' 96 keys wrap; the momentum encoder moving fast enough to tell.
    "densecl": HEADS + ["method.queue_size=32", "method.momentum=0.9", "method.co2_weight=1.0"],
    "supervised": ["method.num_classes=10", "augmentation=supervised"],  # one view: main_linear.py's fine-tuning
    # The test ResNet's four stages, every position of each a row of its variance and covariance terms.
    "vcreg": ["method.num_classes=10"],
    # The groups re-clustered by k-means from a queue of 32 and the teacher reset after step 3 (RESUMED: from there).
    "smog": HEADS
    + [
        "method.pred_hidden_dim=32",
        "method.num_groups=8",
        "method.queue_size=32",
        "method.regroup_every=3",
        "method.kmeans_iterations=3",
        "method.base_momentum=0.9",
        "method.final_momentum=0.9",
    ],
    "simsiam": HEADS + ["method.pred_hidden_dim=8"],
    # Four views of one size: each view's target the mean of the other three's projections.
    "fastsiam": HEADS + ["method.pred_hidden_dim=8"],
    # The temperature from the global batch's alignment, every other view of it a negative.
    "macl": HEADS + ["method.co2_weight=1.0"],
    # Four global views, their mean, standard deviation and sorted projections on 16 directions over the global batch.
    "visreg": HEADS + ["augmentation=digits_four_views", "method.num_slices=16"],
    # Support sets of 64 that 6 steps of 16 wrap, as MoCo v2+'s queue.
    "nnsiam": HEADS + ["method.pred_hidden_dim=8", "method.queue_size=64"],
    "nnclr": HEADS + ["method.pred_hidden_dim=32", "method.queue_size=64", "method.koleo_weight=0.1"],
    "nnbyol": HEADS + ["method.pred_hidden_dim=32", "method.queue_size=64", "method.base_momentum=0.9"],
    "ressl": HEADS + ["method.queue_size=64", "method.base_momentum=0.9"],
    "supcon": HEADS,
    # One whitened sub-batch of 16 that spans both ranks at W = 2.
    "wmse": ["method.proj_hidden_dim=32", "method.proj_output_dim=8", "method.whitening_size=16"],
    "vibcreg": HEADS + ["method.iternorm_groups=4"],
    # 64 samples, 4 steps per epoch: the k-means after step 4 gives steps 5 and 6 their loss.
    "all4one": HEADS + ["method.pred_hidden_dim=32", "method.queue_size=64", "method.base_momentum=0.9"],
    "deepclusterv2": HEADS + ["method.num_prototypes=[4,6]", "method.kmeans_iterations=3"],
    # Multi-crop: every view pulled to the 2 global crops' centre, SIGReg on all 6; 16 directions, new every step.
    "lejepa": HEADS + ["augmentation=multicrop_digits", "method.num_slices=16"],
    # DCLW: DCL's global negatives, and the positive's weights over the global batch.
    "dcl": HEADS + ["method.weight_fn=vmf", "method.co2_weight=1.0"],  # CO2 with the batch's negatives, as SimCLR's
    # Multi-crop: centroids of all 6 views; 8 dimensions (the centroids' 16 x 8 matrix has no vanishing singular
    # value) and the per-sample nuclear norms too.
    "mmcr": [
        "method.proj_hidden_dim=32",
        "method.proj_output_dim=8",
        "augmentation=multicrop_digits",
        "method.lambd=0.1",
    ],
    # A momentum teacher and the running covariance of the global batch, carried over the 6 steps (in the checkpoint).
    "tico": HEADS + ["method.base_momentum=0.9", "method.dse_weight=0.1"],
    # No projector: InfoNCE on the first 8 of the test ResNet's 96 features.
    "directclr": ["method.d0=8"],
    # Each view's uniformity over every pair of the global batch.
    "align_uniform": HEADS,
    # Three patches of one size: each one's coding rate over the global batch, the image means per sample.
    "emp_ssl": HEADS + ["augmentation=emp_ssl_digits", "augmentation.views.0.count=3"],
    # Each view's column means, norms and covariance over the global batch.
    "frossl": HEADS,
    # The cross- and auto-covariances of the global batch, centred with its means.
    "ssl_ey": HEADS,
    # The test ResNet's 2 x 2 maps: every cell matched by feature, 2 and 3 by location from the views' boxes; the local
    # statistics per matched slot over the global batch.
    "vicregl": HEADS
    + ["method.maps_hidden_dim=16", "method.maps_output_dim=8", "method.num_matches=[2,3]", "method.dse_weight=0.1"],
    # The test ResNet's 2 x 2 maps pooled over a 2 x 2 grid of the image and the whole image; each region's negatives
    # every region of both views of the global batch.
    "detcon": HEADS + ["method.grid=2", "method.image_region=true"],
    # The 16 px image and a 24 px view cut into 8 px tiles; a bank of the 51 train samples, which the 6 steps of 16
    # rows revisit (4 steps an epoch), so that steps 5 and 6 score against entries the run moved.
    "pirl": ["method.proj_output_dim=16", "augmentation=pirl_digits"],
    # DINOv2 on TINY_DINO_FAMILY's ViT, with 2 registers: 2 global 16 px crops, most of them masked, and 4 local 8 px
    # ones; the teacher temperature warms up over the first epoch.
    "dinov2": TINY_DINO_FAMILY
    + [
        "backbone.num_registers=2",
        "method.mask_probability=0.8",
        # DINOv3's Gram anchoring: the anchor taken after steps 2 and 4 (a resume from step 3 reads it from the
        # checkpoint), its loss from step 3.
        "method.gram_anchor=2.0",
        "method.gram_start=2",
        "method.gram_refresh=2",
        # PaKA on its own views (DINOv3.1's): the global crops' clean renders through the EMA teacher, 4 local 8 px
        # crops inside them through the student, aligned by their boxes, both through PaKA's heads
        "augmentation=dinov31_digits",
        "method.paka_weight=0.5",
        "method.paka_locals=4",
        # DSE on the student's patch tokens: k-means groups of 8 images of the global batch, which span ranks
        "method.dse_weight=0.1",
    ],
    # As DINOv2's, with iBOT's own: a last layer of 32 prototypes for the patches, their teacher temperature warming
    # up from 0.04 to 0.07 over the first epoch (4 steps), every global crop masked.
    "ibot": TINY_DINO_FAMILY + ["method.patch_prototypes=32"],
    # As DINOv2's, with Franca's: three nesting levels (16, 32 and 64 of the ViT's features; 16 to 64 prototypes), the
    # patches' own heads (8 to 32 prototypes), each level's Sinkhorn-Knopp targets over the global batch, rolled
    # inverse-block masks.
    "franca": TINY_DINO_FAMILY
    + [
        "method.patch_prototypes=32",
        "method.nesting_levels=3",
        "method.centering=sinkhorn_knopp",
        "method.mask_probability=0.8",
        "method.paka_weight=0.5",  # PaKA between each global crop's student and EMA teacher patch kernels
    ],
    # timm's test ViT on a 2 x 2 grid of 8 px patches, distilled from the digits DINOv2 zoo ViT (width 192, 4 px
    # patches: its 4 x 4 grid interpolated to 2 x 2; its input renormalised from the synthetic data's statistics to the
    # digits'): pooled features and patch tokens, through BatchNorm MLP projectors, the squared error.
    "distill": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=8",
        "method.teacher=dinov2-digits-vittiny6",
        "method.loss=mse",
        "method.patch_weight=0.5",
        "method.proj_hidden_dim=32",
    ],
    # timm's test ViT (width 64, 6 blocks) on a 4 x 4 grid of 4 px patches, 12 of them masked; a one-block decoder;
    # DSE on the encoded visible patches (groups of 8 images of the global batch, which span ranks).
    "mae": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.decoder_embed_dim=16",
        "method.decoder_depth=1",
        "method.decoder_heads=2",
        "method.dse_weight=0.1",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches, 10 of them masked; one-block decoders; a momentum target
    # encoder on the ImageNet recipe's views (the target's box moved from the online one's, flipped with it).
    "cmae": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "augmentation=cmae",
        "method.decoder_embed_dim=16",
        "method.decoder_depth=1",
        "method.feature_decoder_depth=1",
        "method.decoder_heads=2",
        *HEADS,
        "method.pred_hidden_dim=32",
        "method.base_momentum=0.9",
        "method.final_momentum=0.95",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches: 12 hidden, 4 of them predicted; a one-block decoder reading
    # the mix of the input and every block's output.
    "crossmae": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.predict_ratio=0.25",
        "method.decoder_embed_dim=16",
        "method.decoder_depth=1",
        "method.decoder_heads=2",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches with a register: per-sample context and 4 target blocks; a
    # one-block predictor.
    "ijepa": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "backbone.num_registers=1",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.predictor_embed_dim=16",
        "method.predictor_depth=1",
        "method.predictor_heads=2",
        "method.base_momentum=0.9",
        "method.dse_weight=0.1",  # on each image's encoded context, its padding marked
    ],
    # timm's test ViT (width 64) on a 4 x 4 grid, I-JEPA's masks; the frozen teacher the MAE zoo ViT (width 192, the
    # same grid): the predictor maps to the teacher's width.
    "salt": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.teacher=mae-digits-vittiny6",
        "method.predictor_embed_dim=16",
        "method.predictor_depth=1",
        "method.predictor_heads=2",
    ],
    # timm's test ViT with a register, 60% of its 16 patches hidden in blocks of 2 or more; the top 2 blocks averaged.
    "data2vec": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "backbone.num_registers=1",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.min_mask_block=2",
        "method.average_top_k_layers=2",
        "method.base_momentum=0.9",
    ],
    # timm's test ViT with a register on a 4 x 4 grid: 2 masks per image, 6 patches visible (a 2 x 2 block and 2
    # more); the top 2 blocks' feed-forward outputs averaged; a 2-layer decoder; the class term on.
    "data2vec2": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "backbone.num_registers=1",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.mask_ratio=0.6",
        "method.mask_block=2",
        "method.masks_per_image=2",
        "method.average_top_k_layers=2",
        "method.decoder_dim=16",
        "method.decoder_layers=2",
        "method.decoder_groups=4",
        "method.base_momentum=0.9",
    ],
    # timm's test ViT, 40% of its 16 patches hidden in blocks of 2 or more; HOG in 2 px cells (2 x 2 per patch).
    # As MaskFeat's: block masks on the 4 x 4 grid; a vocabulary of 32 tokens.
    "beit": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.min_mask_block=2",
        "method.vocab_size=32",
    ],
    "maskfeat": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.min_mask_block=2",
        "method.hog_cell=2",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches, hidden in 8 px squares (3 of the 4, 12 patches); a linear head.
    "simmim": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.mask_patch_size=8",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches: 15 next embeddings per image.
    "nepa": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
    ],
    # The digits' Franca zoo backbone (its shape, frozen), 3 stages of 2 steps: two planes fold into the removal mid-run.
    "rasa": [
        "backbone.name=vit_tiny_patch16_224",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "+backbone.kwargs.depth=6",
        "+backbone.kwargs.dynamic_img_size=true",
        "trainer.init_from=franca-digits-vittiny6",
        "method.stages=3",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches, a prefix of 1 to 15 per sample; a one-block head.
    "aim": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.head_width=16",
        "method.head_depth=1",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches: 10 hidden outside a visible block of 6, 5 of them predicted
    # (per sample); a one-block predictor, 16 prototypes, Sinkhorn-Knopp per position over the global batch.
    "capi": [
        "backbone.name=test_vit",
        "backbone.small_stem=false",
        "+backbone.kwargs.img_size=16",
        "+backbone.kwargs.patch_size=4",
        "method.num_prototypes=16",
        "method.predictor_depth=1",
        "method.predictor_heads=2",
        "method.prediction_subsampling=0.5",
        "method.base_momentum=0.9",
    ],
    # timm's test ViT on a 4 x 4 grid of 4 px patches: the target crop whole, the anchor crop with 4 of its 16 patches
    # dropped (per sample), 4 focal 8 px crops; 16 prototypes, the targets' Sinkhorn-Knopp and the mean-entropy term
    # (PMSN: the power-law prior) over the global batch, the teacher's BatchNorms synchronised.
    **{
        name: [
            "backbone.name=test_vit",
            "backbone.small_stem=false",
            "+backbone.kwargs.img_size=16",
            "+backbone.kwargs.patch_size=4",
            "augmentation=multicrop_digits",
            "method.proj_hidden_dim=32",
            "method.proj_output_dim=16",
            "method.num_prototypes=16",
            "method.mask_ratio=0.25",
            "method.sinkhorn_iterations=3",  # the paper's (the digits default has none)
            "method.base_momentum=0.9",
            "optim=lars",  # as dinov2's: AdamW lifts float64 rounding in elements whose gradient is near 0
            *(["method.dse_weight=0.1"] if name == "msn" else []),  # on the masked anchor's encoded patches
        ]
        for name in ("msn", "pmsn")
    },
}
STEPS = 6


def method_overrides(method: str) -> list[str]:
    """A tiny float64 run of `method` (any registered one: those without an entry in METHOD take small heads)."""
    settings = METHOD.get(method, HEADS)
    base = BASE if "data=digits" not in settings else [o for o in BASE if o in TINY_FILES or o not in TINY]
    return base + [f"method={method}", *settings]


def overrides(method: str, batch: int) -> list[str]:
    # A checkpoint at every step where a test reads one: the 2 x 8 runs of the methods resumed below (rewound to step 3),
    # and iBOT's 1 x 16 run (its schedules, step by step); the others keep their last one (a second each at these sizes).
    every = method == "ibot" or (method in RESUMED and batch == 8)
    return method_overrides(method) + [
        f"data.batch_size={batch}",
        f"trainer.max_steps={STEPS}",
        *(EVERY_STEP if every else []),
    ]


EVERY_STEP = ["trainer.checkpoint_every_steps=1", "trainer.keep_checkpoints=10"]


# One method per kind of state of its own: a queue (MoCo v2+; ReSSL's and All4One's are the same GlobalQueue), a
# support set (NNCLR; NNBYOL's and NNSiam's alike), an EMA teacher with a centre and a schedule (DINO; BYOL's, MoCo
# v3's alike), a memory bank with k-means (DeepClusterV2), per-sample masks (MAE, DINOv2, iBOT and its second
# temperature schedule, I-JEPA), a frozen pretrained
# teacher saved with the weights (distill; LiT's locked tower is loaded and saved the same way), a running covariance
# of the global batch (TiCo), a removal that stages fold in by step (RASA: the resumed run crosses a fold); and
# VICReg for the rest, whose state (weights, BatchNorm buffers, optimizer, data position, random state) is the
# trainer's alike.
RESUMED = set("vicreg mocov2plus dino nnclr deepclusterv2 mae dinov2 ibot ijepa distill tico smog rasa".split())


INVARIANCE_TEST = "test_step_is_world_size_invariant_and_resumes_exactly"
# CI's cases of the invariance test (the others: `pytest -m exhaustive`, about 7 s a method): those resumed, and a
# method of each kind of step that neither they nor CI's FSDP cases (tests/test_strategies.py) have: prototypes with
# Sinkhorn online (CAPI) and with masked multi-crop (MSN), an average of the teacher's layers (data2vec), an
# autoregressive ViT (AIM), regions of views (VICRegL's boxes), a bank with jigsaw (PIRL) and directions drawn by step
# (LeJEPA). Left to exhaustive for CI's budget (.ci/run), their kinds being in CI elsewhere: two towers (SigLIP: CLIP's
# DDP and FSDP layouts), labels (SupCon: the checker's case and the batch fields' layouts, tests/test_batch_spec.py),
# many views (EMP-SSL: DINO's multi-crop here), regions as masks (DetCon: VICRegL's regions here). Every registered
# loss is also checked alone at W = 1 to 4 in CI (tests/test_distributed.py).
INVARIANCE_KINDS = RESUMED | set("capi msn data2vec aim vicregl pirl lejepa".split())


@pytest.fixture(scope="module")
def launched_runs(request, tmp_path_factory):
    """(1 x 16, 2 x 8): method -> run dir, for the methods of the invariance test selected, in two launches at once
    (tests/many_runs.py). The 1-process launch takes the core that the 2-process one leaves idle while its ranks
    wait on each other, and the 1 x 16 runs leave the worker that runs the process groups one at a time."""
    root = tmp_path_factory.mktemp("runs")
    methods = selected_methods(request)
    one, two = ({m: root / world / m for m in methods} for world in ("w1", "w2"))
    if methods:
        with ThreadPoolExecutor(2) as launches:
            started = [
                launches.submit(many_runs, {d: overrides(m, 16) for m, d in one.items()}, nproc=1),
                launches.submit(many_runs, {d: overrides(m, 8) for m, d in two.items()}, nproc=2),
            ]
            for launch in started:
                launch.result()
    return one, two


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory, launched_runs):
    """method -> the run dir of its 1 x 16 run: the launched one, else trained in this process once."""
    done = dict(launched_runs[0])

    def run_dir(method):
        if method not in done:
            done[method] = tmp_path_factory.mktemp(f"{method}_w1")
            pretrain(compose_cfg(overrides(method, 16)), done[method])
        return done[method]

    return run_dir


def rewound(run_dir: Path, copy: Path, step: int) -> Path:
    """A copy of a finished run with one checkpoint, `step`'s, as `last`: run again, it resumes from there, as after a
    kill between two checkpoints. (A run that started afresh would write the checkpoints of steps 1.. again.)"""
    shutil.copytree(run_dir, copy, symlinks=True)
    checkpoints = copy / "checkpoints"
    for other in checkpoints.glob("step-*"):
        if other.name != f"step-{step:09d}":
            shutil.rmtree(other)
    (checkpoints / "last").unlink()
    (checkpoints / "last").symlink_to(f"step-{step:09d}")
    return copy


def selected_methods(request) -> list[str]:
    return sorted(
        {item.callspec.params["method"] for item in request.session.items if item.originalname == INVARIANCE_TEST}
    )


@pytest.fixture(scope="module")
def two_process_runs(launched_runs):
    """method -> the run dir of its 2 x 8 run."""
    return launched_runs[1]


@pytest.fixture(scope="module")
def resumed_runs(request, tmp_path_factory, two_process_runs):
    """method -> its 2 x 8 run rewound to step 3 and run again to the end (RESUMED's selected methods, one launch)."""
    root = tmp_path_factory.mktemp("resumed")
    runs = {m: rewound(two_process_runs[m], root / m, 3) for m in selected_methods(request) if m in RESUMED}
    if runs:
        many_runs({d: overrides(m, 8) for m, d in runs.items()})
    return runs


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", [m if m in INVARIANCE_KINDS else pytest.param(m, marks=pytest.mark.exhaustive) for m in sorted(METHOD)]
)
def test_step_is_world_size_invariant_and_resumes_exactly(method, one_process_run, two_process_runs, resumed_runs):
    """W=1 x 16 == W=2 x 8 to 1e-10 of the weight movement after 6 steps (float64); then (RESUMED) the 2-process run
    resumed from its step-3 checkpoint ends bit-identical to the uninterrupted one. (A kill's own hazards, a step
    cut short and a checkpoint half written, are method-independent: tests/test_train.py and tests/test_restarts.py.)"""
    one, two = weights(one_process_run(method)), weights(two_process_runs[method])
    start = weights_at_init(overrides(method, 16))
    moved = {k: float((one[k] - start[k]).abs().max()) for k in start}  # not the state sized by the data (banks)
    target = METHODS[method].target
    # A frozen pretrained module is a teacher by its method's name for it (LiT's locked tower is its backbone).
    frozen = tuple(f"method.{name}." for name in target.teachers) if target.pretrained_teacher else ("method.teacher.",)
    teacher = [k for k in moved if k.startswith(frozen)]
    if target.pretrained_teacher:
        assert teacher and not any(moved[k] for k in teacher), "a frozen teacher stays as it was loaded"
    else:  # Not every tensor: a bias that feeds a BatchNorm gets no gradient, in the student as in its EMA copy.
        assert not teacher or any(moved[k] > 0 for k in teacher), "the teacher moves"
    worst, name = max((float((one[k] - two[k]).abs().max()), k) for k in one)
    assert worst <= 1e-10 * max(moved.values()), f"{method}: {name} differs by {worst} between W=1 and W=2"
    if method not in RESUMED:
        return
    resumed = resumed_runs[method]
    # Resumed, not started afresh: the rerun wrote the checkpoints of steps 4 to 6 and none of steps 1 and 2.
    written = sorted(int(d.name.removeprefix("step-")) for d in (resumed / "checkpoints").glob("step-*"))
    assert written == list(range(3, STEPS + 1)), written
    after = weights(resumed)
    for key in two:
        assert torch.equal(two[key], after[key]), f"{method}: {key} differs after resume"


@pytest.mark.slow
def test_ibot_warms_its_patch_temperature_and_freezes_both_last_layers(one_process_run):
    """The 1 x 16 run of the invariance test above (a checkpoint every step): the patches' teacher temperature rises
    from 0.04 to 0.07 over the first epoch (4 steps) while the class token's stays at 0.04; the class token's and the
    patches' last layers (two of them: method.patch_prototypes) are frozen for 2 steps, then trained."""
    run_dir = one_process_run("ibot")
    patch = [float(checkpoint(run_dir, s)["method.patch_teacher_temperature"]) for s in (1, 2, 4, 5)]
    assert patch == pytest.approx([0.0475, 0.055, 0.07, 0.07])
    assert [float(checkpoint(run_dir, s)["method.teacher_temperature"]) for s in (1, 5)] == pytest.approx([0.04, 0.04])
    start = weights_at_init(overrides("ibot", 16))
    for layer in ("method.head.last_layer.weight", "method.head.patch_last_layer.weight"):
        assert torch.equal(checkpoint(run_dir, 2)[layer].to(start[layer].dtype), start[layer]), layer
        assert not torch.equal(checkpoint(run_dir, 3)[layer].to(start[layer].dtype), start[layer]), layer
    assert checkpoint(run_dir, 1)["method.head.patch_last_layer.weight"].shape == (32, 16)


# Each kind of state and its known-wrong variant (tests/local_state_methods.py): filled with each rank's rows only.
RANK_LOCAL = {
    "mocov2plus": ("mocov2plus_local_queue", "method.queues.0.count"),
    "nnclr": ("nnclr_local_support", "method.support.count"),
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(RANK_LOCAL))
def test_rank_local_state_is_not_world_size_invariant(tmp_path, method, one_process_run):
    """The wrong variant of a global queue or support set: each rank pushes only its own rows. 1 x 16 and 2 x 8 then
    differ, by far more than rounding, once the state is read (step 2 on); the global one (the test above) does not."""
    local_name, count = RANK_LOCAL[method]
    local = [o for o in overrides(method, 8) if not o.startswith("method=")] + [
        f"method={local_name}",
        "imports=[tests.local_state_methods]",
        f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]",
    ]
    run(local, tmp_path / "local_w2", nproc=2)
    one, two, start = (
        weights(one_process_run(method)),
        weights(tmp_path / "local_w2"),
        weights_at_init(overrides(method, 16)),
    )
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    worst = max(
        float((one[k] - two[k]).abs().max()) for k in start if not k.startswith(("method.queues.", "method.support."))
    )
    assert worst > 1e-4 * moved, f"a rank-local state changed the weights by only {worst} of {moved}"
    assert int(checkpoint(one_process_run(method), STEPS)[count]) == 16 * STEPS  # every row of every step: it wrapped


def test_a_queue_smaller_than_the_global_batch_is_refused():
    with pytest.raises(ConfigError, match=r"method.queue_size=8 is smaller than the global batch \(16\)"):
        compose_cfg(overrides("mocov2plus", 16) + ["method.queue_size=8"])


@pytest.mark.parametrize(
    "given, message",
    [
        ("method.paka_weight=1 method.paka_locals=4", r"paka_locals=4: .*\[16, 16, 8, 8, 8, 8\]\) end with nothing"),
        ("method.paka_locals=4 augmentation=dinov31_digits", r"paka_locals=4: .* for paka_weight > 0"),
        ("method.paka_weight=1 method.paka_locals=3 augmentation=dinov31_digits", r"paka_locals=3: .* an even number"),
        ("method.paka_weight=1 method.paka_locals=2 augmentation=dinov31_digits", r"end with 6 views from a global"),
    ],
)
def test_paka_views_without_their_augmentation_or_weight_are_refused(given, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(BASE + ["method=dinov2", *TINY_DINO_FAMILY, *given.split()])


def checkpoint(run_dir, step: int) -> dict:
    return read_checkpoint(run_dir / "checkpoints" / f"step-{step:09d}")["model"]


@pytest.mark.parametrize("use_bn", [False, True])
def test_dino_head_is_the_papers(use_bn):
    """MLP with GELU (BatchNorm after each hidden layer with use_bn_in_head), DINO's initialisation (normal weights of
    std 0.02, zero biases), an L2-normalised bottleneck, and prototypes of norm 1 whatever their stored weights."""
    from solo.methods.dino import DINOHead

    torch.manual_seed(0)
    head = DINOHead(64, 512, 32, 100, use_bn=use_bn)
    linears = [m for m in head.mlp if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 512), (512, 512), (512, 32)]
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in head.mlp) == (2 if use_bn else 0)
    for m in linears:
        assert abs(float(m.weight.detach().std()) - 0.02) < 0.002 and not m.bias.any()
    x = torch.randn(8, 64)
    with torch.no_grad():
        head.last_layer.weight.mul_(torch.rand(100, 1) * 5)  # any norms: the prototypes are normalised in forward
        bottleneck = F.normalize(head.mlp(x), dim=1)
        assert torch.allclose(head(x), bottleneck @ F.normalize(head.last_layer.weight, dim=1).T, atol=1e-6)


def multi_crop(backbone, head, views: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    """The official multi-crop forward (DINO's MultiCropWrapper, SwAV's ResNet.forward): the backbone once on each
    crop size's views concatenated (`sizes`: views per size), the head once on every crop's output."""
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    outputs = [backbone(torch.cat(views[a:b])) for a, b in zip(starts, starts[1:])]
    return list(head(torch.cat(outputs)).chunk(len(views)))


def one_view_at_a_time(backbone, head, views: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    """The known-wrong variant for SwAV and DINO: each view's own BatchNorm statistics in the backbone and the head."""
    return [head(backbone(v)) for v in views]


def cross_entropies(targets: list[torch.Tensor], logits: list[torch.Tensor]) -> torch.Tensor:
    """The mean over pairs (target g, view v != g) of the batch mean of sum_k -target_g[k] log softmax(logits_v)[k]."""
    pairs = [(g, v) for g in range(len(targets)) for v in range(len(logits)) if v != g]
    terms = [-(targets[g] * F.log_softmax(logits[v], dim=1)).sum(1).mean() for g, v in pairs]
    return sum(terms) / len(pairs)


@pytest.mark.parametrize("forward, matches", [(multi_crop, True), (one_view_at_a_time, False)])
@pytest.mark.parametrize("method", ["dino", "swav", "simclr"])
def test_batchnorm_statistics_are_the_official_codes(method, forward, matches):
    """DINO and SwAV on 2 global 16 px crops and 4 local 8 px ones, SimCLR on 2 views (a ResNet, BatchNorm in the
    heads; float64): the loss equals its formula on the outputs of the official code's forward (the crops of one size
    through the backbone together, every crop through the head at once; the DINO teacher's on the global crops), and
    not on those of one call per view."""
    import copy

    from solo.backbones import create_backbone
    from solo.methods import build_method
    from tests.wrong_losses import rank_sinkhorn

    g = torch.Generator().manual_seed(0)
    sizes = [2] if method == "simclr" else [2, 4]
    views = [torch.randn(6, 3, s, s, generator=g, dtype=torch.float64) for s in (16, 16, 8, 8, 8, 8)[: sum(sizes)]]
    torch.manual_seed(0)
    backbone, width = create_backbone("test_resnet", small_stem=True, pretrained=False)
    extra = HEADS if method == "simclr" else METHOD[method]  # multi-crop; DINO's heads with BatchNorm
    cfg = compose_cfg(
        BASE + [f"method={method}", *extra, "data.batch_size=16", "method.dse_weight=0"]
    )  # the loss alone
    model = build_method(cfg.method, backbone, width).double()
    reference = copy.deepcopy(model)
    loss = model({"views": views, "label": torch.arange(6) % 3})["loss"]
    c = cfg.method
    with torch.no_grad():
        if method == "dino":
            student = forward(reference.backbone, reference.head, views, sizes)
            teacher = forward(reference.teacher[0], reference.teacher[1], views[:2], sizes[:1])
            temperature = float(reference.teacher_temperature)
            targets = [F.softmax((t - reference.center) / temperature, dim=1) for t in teacher]
            expected = cross_entropies(targets, [s / c.student_temperature for s in student])
        elif method == "simclr":  # NT-Xent: each of the 2N rows against the other 2N - 1, its other view the positive
            z = F.normalize(torch.cat(forward(reference.backbone, reference.projector, views, sizes)), dim=1)
            logits = (z @ z.T / c.temperature).fill_diagonal_(float("-inf"))
            expected = F.cross_entropy(logits, torch.arange(12).roll(6))
        else:
            projected = forward(reference.backbone, reference.projector, views, sizes)
            embeddings = [F.normalize(e, dim=1) for e in projected]
            scores = [reference.prototypes(e) for e in embeddings]
            targets = [rank_sinkhorn(s, c.epsilon, c.sinkhorn_iterations) for s in scores[:2]]  # one process's
            expected = cross_entropies(targets, [s / c.temperature for s in scores])
    difference = float((loss - expected).abs())
    assert difference < 1e-10 if matches else difference > 1e-4, difference


@pytest.mark.slow
@pytest.mark.one_process
def test_dino_freezes_its_last_layer_warms_its_teacher_and_centres_on_the_batch(tmp_path):
    cfg = overrides("dino", 16) + EVERY_STEP
    pretrain(compose_cfg(cfg), tmp_path)
    start = weights_at_init(cfg)
    last = "method.head.last_layer.weight"
    # 0.5 epoch = 2 steps frozen: no update at all (not even weight decay), then trained.
    assert torch.equal(checkpoint(tmp_path, 2)[last], start[last])
    assert not torch.equal(checkpoint(tmp_path, 3)[last], start[last])
    assert not torch.equal(checkpoint(tmp_path, 1)["method.head.mlp.0.weight"], start["method.head.mlp.0.weight"])
    # The teacher temperature rises linearly over the first epoch (4 steps), from 0.02 to 0.04.
    temperatures = [float(checkpoint(tmp_path, s)["method.teacher_temperature"]) for s in (1, 2, 4, 5)]
    assert temperatures == pytest.approx([0.025, 0.03, 0.04, 0.04])
    centre = checkpoint(tmp_path, 1)["method.center"]
    assert centre.abs().sum() > 0 and torch.equal(start["method.center"], torch.zeros_like(centre))


@pytest.mark.slow  # 5 steps of DINOv2 with multi-crop in float64: about 15 s
@pytest.mark.one_process
def test_dinov2_gram_anchor_is_the_ema_teacher_of_its_step_and_its_loss_starts_after_it(tmp_path):
    """method.gram_anchor with gram_start=2, gram_refresh=2: the anchor is the EMA teacher's backbone copied after step
    2, then after step 4 (the checkpoints of each step hold both); before step 2 it is none of the teacher's states.
    The Gram loss is logged from step 3 on, none before."""
    cfg = overrides("dinov2", 16) + EVERY_STEP + ["trainer.max_steps=5"]
    pretrain(compose_cfg(cfg), tmp_path)

    def part(step: int, prefix: str) -> dict:
        return {k.removeprefix(prefix): v for k, v in checkpoint(tmp_path, step).items() if k.startswith(prefix)}

    teacher, anchor = "method.teacher.0.", "method.gram_teacher."
    assert part(1, anchor).keys() == part(1, teacher).keys()
    assert not all(torch.equal(v, part(1, teacher)[k]) for k, v in part(1, anchor).items())
    for step, taken in ((2, 2), (3, 2), (4, 4), (5, 4)):
        taken_from = part(taken, teacher)
        assert all(torch.equal(v, taken_from[k]) for k, v in part(step, anchor).items()), step
    assert not all(torch.equal(v, part(2, teacher)[k]) for k, v in part(4, anchor).items()), "refreshed at step 4"
    assert [m["step"] for m in metrics(tmp_path) if "train/gram_loss" in m] == [3, 4, 5]


def test_swav_prototypes_stay_unit_vectors_and_are_frozen_first(tmp_path):
    cfg = overrides("swav", 16) + ["trainer.max_steps=3", "trainer.checkpoint_every_steps=1"]
    pretrain(compose_cfg(cfg), tmp_path)
    start, prototypes = weights_at_init(cfg), "method.prototypes.weight"
    # Frozen for 2 steps: only renormalised (the float32 initial unit vectors, renormalised in float64).
    torch.testing.assert_close(checkpoint(tmp_path, 2)[prototypes], start[prototypes].double(), rtol=0, atol=1e-7)
    after = checkpoint(tmp_path, 3)[prototypes]
    assert (after - start[prototypes].double()).abs().max() > 1e-4
    torch.testing.assert_close(after.norm(dim=1), torch.ones(16, dtype=after.dtype))


def test_unknown_method_lists_every_method():
    with pytest.raises(MissingConfigException) as err:
        compose_cfg(["method=bool"])
    builtin = [m.name for m in METHODS if m.target.__module__.startswith("solo.")]  # other tests register their own
    assert len(builtin) == 60 and all(name in str(err.value) for name in builtin)


@pytest.mark.parametrize(
    "method, views, message",
    [
        (
            "byol",
            "augmentation=multicrop_digits",
            # Those that take these views: not VISReg (4 global views) nor PIRL (the image and its jigsaw's view);
            # methods that other test modules register may follow.
            r"only used by methods that take local crops \(dino, dinov2, franca, ibot, lejepa, mmcr, msn, pmsn, swav"
            r"(\)|, (?!visreg|pirl))",
        ),
        (
            "dino",
            "augmentation=multicrop_digits augmentation.views.1.size=32",
            r"local crops .* must be smaller than 16 px",
        ),
        (
            "swav",
            "augmentation=clip",
            r"swav compares 2 view\(s\) of one size first, but augmentation.views gives sizes \[16\]",
        ),
        # EMP-SSL's patches are all of one size: multi-crop's smaller crops, or one view, are refused.
        ("emp_ssl", "augmentation=multicrop_digits", r"\[16, 16, 8, 8, 8, 8\]: method=emp_ssl takes 2 or more patches"),
        ("emp_ssl", "augmentation=clip", r"\[16\]: method=emp_ssl takes 2 or more patches of one size"),
    ],
)
def test_views_a_method_cannot_use_are_refused_with_the_reason(method, views, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(BASE + [f"method={method}", *views.split()])


@pytest.mark.parametrize(
    "override",
    [
        "method=byol method.base_momentum=1.5",
        "method=mocov3 method.final_momentum=-0.1",
        "method=dino method.base_momentum=2",
    ],
)
def test_teacher_momentum_outside_0_1_is_refused(override):
    key = override.split()[1].split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}.*must be in \[0, 1\]"):
        compose_cfg(BASE + override.split())


def test_byol_targets_are_the_teachers_and_take_no_gradient():
    """The loss's value from the module equals BYOL's formula on the teacher's output of the other view."""
    from solo.backbones import create_backbone
    from solo.methods import build_method

    torch.manual_seed(0)
    backbone, width = create_backbone("test_resnet", small_stem=True, pretrained=False)
    cfg = compose_cfg(BASE + ["method=byol", *METHOD["byol"]]).method
    byol = build_method(cfg, backbone, width).double()
    views = [torch.randn(6, 3, 16, 16, dtype=torch.float64) for _ in range(2)]
    out = byol({"views": views, "label": torch.zeros(6, dtype=torch.long)})
    p = [byol.predictor(byol.projector(byol.backbone(v))) for v in views]
    with torch.no_grad():
        t = [byol.teacher[1](byol.teacher[0](v)) for v in views]
    expected = sum((2 - 2 * F.cosine_similarity(a, b.detach())).mean() for a, b in ((p[0], t[1]), (p[1], t[0])))
    torch.testing.assert_close(out["loss"], expected, rtol=1e-12, atol=1e-12)
    out["loss"].backward()
    assert all(q.grad is None for q in byol.teacher.parameters())


def hand_koleo(x: torch.Tensor) -> torch.Tensor:
    """KoLeo by its formula: -mean over rows of log(the distance to the nearest other row), rows unit-normalised."""
    x = x / x.norm(dim=1, keepdim=True)
    distances = torch.cdist(x, x) + torch.diag(torch.full((len(x),), float("inf"), dtype=x.dtype))
    return -distances.min(dim=1).values.log().mean()


@pytest.mark.parametrize(
    "method", ["simclr", "vicreg", "byol", "simsiam", "fastsiam", "supcon", "dino", "visreg", "tico"]
)
def test_koleo_adds_its_weight_times_koleo_of_each_views_backbone_features(method):
    """method.koleo_weight=w (a method of each two-view base, one of more views, one with labels and multi-crop's
    DINO, on its global crops; TiCo on its student's one view): the loss is the method's own plus w x the sum over the
    views of KoLeo's formula on the backbone's features of that view; w = 0 leaves the method as it was."""
    from solo.backbones import create_backbone
    from solo.methods import build_method

    g = torch.Generator().manual_seed(0)
    views = [
        torch.randn(6, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(METHODS[method].target.num_views)
    ]
    batch = {"views": views, "label": torch.arange(6) % 3}
    losses = {}
    for weight in (0.0, 0.25):
        torch.manual_seed(0)
        backbone, width = create_backbone("test_resnet", small_stem=True, pretrained=False)
        cfg = compose_cfg(BASE + [f"method={method}", *METHOD.get(method, HEADS), f"method.koleo_weight={weight}"])
        out = build_method(cfg.method, backbone, width).double()(batch)
        losses[weight] = out["loss"]
    spread = sum(hand_koleo(f) for f in out["features"].split(6))  # each view the student encodes
    torch.testing.assert_close(losses[0.25] - losses[0.0], 0.25 * spread, rtol=1e-6, atol=1e-9)


# Every method that takes DSE through its backbone's forward (Method.encode_backbone, or the maps it reads itself);
# those that take it on their masked tokens have tests of their own (tests/test_reference_formulas.py: DINOv2's,
# MAE's, I-JEPA's, MSN's; iBOT and Franca are DINOv2's, SALT I-JEPA's, PMSN MSN's).
ON_MASKED_TOKENS = {"dinov2", "ibot", "franca", "mae", "ijepa", "salt", "msn", "pmsn"}
DSE_ON_THE_BACKBONE = sorted(
    name
    for name in METHODS.names()
    if "dse_weight" in {f.name for f in dataclasses.fields(METHODS[name].schema)} and name not in ON_MASKED_TOKENS
)
TEST_VIT = [
    "backbone.name=test_vit",
    "backbone.small_stem=false",
    "+backbone.kwargs.img_size=16",
    "+backbone.kwargs.patch_size=4",
]


@pytest.mark.parametrize(
    "method, backbone",
    [(name, "test_resnet") for name in DSE_ON_THE_BACKBONE] + [("simclr", "test_vit"), ("dino", "test_vit")],
)
def test_dse_adds_its_weight_times_minus_dse_of_the_global_views_dense_tokens(method, backbone, tmp_path):
    """method.dse_weight=w on a batch of the method's own data: the loss falls by w x DSE of the backbone's dense tokens
    of each global view the student encodes (DenseCL's, TiCo's and PIRL's: the first alone), as timm's forward_features
    gives them (a ResNet's last map position by position, a ViT's patch tokens), view by view, k-means++ drawn from the
    run's uniforms of the step; w = 0 leaves it as it was. The images in another order (other groups of 8 for
    k-means) would give another value. In eval mode: BatchNorm's statistics are then the same however the views are
    grouped."""
    from solo.backbones.stochastic import step_uniforms
    from solo.distributed.env import detect
    from solo.train.trainer import Trainer

    vit = TEST_VIT if backbone == "test_vit" else []
    cfg = compose_cfg(method_overrides(method) + vit + ["data.batch_size=16", "method.dse_weight=0.5"])
    trainer = Trainer(cfg, tmp_path, detect(), torch.device("cpu"))
    on = trainer.model.method.eval()
    off = copy.deepcopy(on)
    off.dse = None
    batch = next(iter(trainer.source))
    losses = {name: m.batch_loss(m.encode(batch), batch)["loss"] for name, m in (("off", off), ("on", on))}
    net, prefix = on.backbone, getattr(on.backbone, "num_prefix_tokens", 0)
    with torch.no_grad():
        students = 1 if method in {"densecl", "tico", "pirl"} else on.num_views
        maps = [net.forward_features(view) for view in batch["views"][:students]]
    tokens = [m[:, prefix:] if backbone == "test_vit" else m.flatten(2).mT for m in maps]
    want = dse_score(tokens, uniforms=step_uniforms(on, "dse"))
    torch.testing.assert_close(losses["off"] - losses["on"], 0.5 * want.detach(), rtol=1e-9, atol=1e-12)
    wrong = dse_score([torch.cat(tokens).roll(4, 0)], uniforms=step_uniforms(on, "dse"))
    assert abs(wrong.item() - want.item()) > 1e-6 * abs(want.item())  # 1e-9 is the tolerance above


def test_dse_on_a_backbone_without_dense_tokens_is_refused():
    """A backbone with neither a ViT's patch tokens nor a ResNet's global pool (your own CNN): DSE cannot read its
    tokens; the method is not built, the error names the setting."""
    from solo.methods import build_method

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    cfg = compose_cfg(BASE + HEADS + ["method=byol", "method.dse_weight=0.5"])
    with pytest.raises(
        ConfigError, match=r"method.dse_weight=0.5: it reads the backbone's dense tokens, and Sequential"
    ):
        build_method(cfg.method, cnn, 8)
    build_method(compose_cfg(BASE + HEADS + ["method=byol"]).method, cnn, 8)  # without DSE it trains


def test_more_prototypes_than_samples_are_refused(tmp_path):
    with pytest.raises(
        ConfigError, match=r"method.num_prototypes=\[4, 65\]: k-means cannot make 65 clusters of the 64 samples"
    ):
        pretrain(compose_cfg(overrides("deepclusterv2", 16) + ["method.num_prototypes=[4,65]"]), tmp_path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("method=wmse method.whitening_size=24", r"method.whitening_size=24: .* must divide it"),
        (
            "method=vibcreg method.iternorm_groups=5",
            r"method.proj_output_dim=16 is not a multiple of method.iternorm_groups=5",
        ),
        (
            "method=all4one method.proj_output_dim=12",
            r"method.proj_output_dim=12: All4One's Transformer over it has 8 heads",
        ),
        ("method=nnclr method.queue_size=8", r"method.queue_size=8 is smaller than the global batch \(16\)"),
    ],
)
def test_settings_a_method_cannot_use_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(BASE + HEADS + ["data.batch_size=16"] + override.split())


def test_lejepa_directions_are_drawn_from_the_seed_and_step_alone():
    """Inside the trainer's step the directions (unit columns) come from (run seed, step): the same whatever torch's
    generator holds (each rank seeds its own from its rank), others at the next step or under another seed. Drawn from
    torch's generator instead (a forward outside the step), they differ between two ranks' generators."""
    from solo.backbones import create_backbone
    from solo.backbones.stochastic import Draws
    from solo.methods import build_method

    backbone, width = create_backbone("test_resnet", small_stem=True, pretrained=False)
    method = build_method(compose_cfg(BASE + ["method=lejepa", *METHOD["lejepa"]]).method, backbone, width)
    like = torch.zeros(4, 16, dtype=torch.float64)

    def drawn(seed: int, step: int, rank: int):
        torch.manual_seed(rank)
        Draws(seed, torch.device("cpu")).attach(method).set_step(step)
        directions = method.directions(like)
        method.draws = None  # outside the trainer again
        return directions

    directions = drawn(0, 5, rank=0)
    assert directions.shape == (16, 16) and directions.dtype == torch.float64
    torch.testing.assert_close(directions.norm(dim=0), torch.ones(16, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(directions, drawn(0, 5, rank=1))
    assert not torch.equal(directions, drawn(0, 6, rank=0)) and not torch.equal(directions, drawn(1, 5, rank=0))
    torch.manual_seed(0)
    rank0 = method.directions(like)
    torch.manual_seed(1)
    assert not torch.equal(rank0, method.directions(like))


@pytest.mark.parametrize("name", ["simsiam", "nnsiam"])
def test_simsiam_predictor_learning_rate_is_not_scheduled(name):
    """SimSiam's predictor keeps the base learning rate through warm-up and decay; the rest follows the schedule."""
    from solo.backbones import create_backbone
    from solo.methods import build_method
    from solo.train.step import TrainStep

    torch.manual_seed(0)
    backbone, width = create_backbone("test_resnet", small_stem=True, pretrained=False)
    method = build_method(compose_cfg(BASE + [f"method={name}", *METHOD[name]]).method, backbone, width).double()
    method.set_schedule(steps_per_epoch=4, total_steps=4)
    optimizer = torch.optim.SGD(method.param_groups(weight_decay=0.0, exclude_bias_and_norm=True), lr=1.0)
    step = TrainStep(
        method,
        method,
        optimizer,
        precision="64",
        device=torch.device("cpu"),
        schedule=lambda i: 0.25 * i,
        total_steps=4,
    )
    views = [torch.randn(6, 3, 16, 16, dtype=torch.float64) for _ in range(2)]
    step({"views": views, "label": torch.zeros(6, dtype=torch.long)}, 2)
    predictor = {id(p) for p in method.predictor.parameters()}
    lrs = {("predictor" if id(g["params"][0]) in predictor else "rest", g["lr"]) for g in optimizer.param_groups}
    assert lrs == {("predictor", 1.0), ("rest", 0.5)}
