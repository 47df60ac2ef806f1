"""Gradient accumulation (trainer.accumulate): one step on k micro-batches equals one step on the whole batch."""

import pytest
import torch
import torch.nn as nn

from solo.errors import ConfigError
from solo.train.trainer import build_model, pretrain
from tests.test_train import REPO, TINY, compose_cfg, run, weights

VIT = [
    "backbone=resnet18",
    "backbone.name=vit_tiny_patch16_224",
    "backbone.small_stem=false",
    "+backbone.kwargs.img_size=16",
    "+backbone.kwargs.patch_size=4",
    "+backbone.kwargs.embed_dim=32",
    "+backbone.kwargs.depth=2",
    "+backbone.kwargs.num_heads=2",
]
ONE_STEP = ["trainer.max_steps=1", "trainer.precision=64", "optim.warmup_epochs=0"]
CASES = {  # a LayerNorm image tower (timm's ViT), with SimCLR's BatchNorm projector, and CLIP's two towers
    "simclr_vit": [o for o in TINY if not o.startswith("backbone")] + VIT + ONE_STEP,
    "clip_vit": [o for o in TINY if not o.startswith(("backbone", "method", "data"))]
    + VIT
    + ONE_STEP
    + [
        "method=clip",
        "data=digits",
        "method.embed_dim=16",
        "method.text.width=32",
        "method.text.depth=1",
        "method.text.heads=2",
    ],
    # A momentum teacher (its EMA after the step), multi-crop with a centre (ViT at any input size), Sinkhorn, SigLIP.
    "byol_vit": [o for o in TINY if not o.startswith("backbone")]
    + VIT
    + ONE_STEP
    + ["method=byol", "method.pred_hidden_dim=32"],
    "dino_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + [
        "method=dino",
        "+backbone.kwargs.dynamic_img_size=true",
        "method.proj_hidden_dim=32",
        "method.bottleneck_dim=16",
        "method.num_prototypes=64",
        "method.freeze_last_layer_epochs=0",
    ],
    "swav_vit": [o for o in TINY if not o.startswith("backbone")]
    + VIT
    + ONE_STEP
    + ["method=swav", "augmentation=digits", "method.num_prototypes=16", "method.freeze_prototypes_epochs=0"],
    # A global queue, pushed once per optimizer step with the whole batch's keys: 3 steps, so it is read too (by CO2's
    # consistency as well).
    "mocov2plus_vit": [o for o in TINY if not o.startswith("backbone")]
    + VIT
    + [o for o in ONE_STEP if "max_steps" not in o]
    + ["trainer.max_steps=3", "method=mocov2plus", "method.queue_size=64", "method.co2_weight=1.0"],
    # Every block's output an encoding of its own: VCReg's statistics over the whole batch's tokens, in batch_loss.
    "vcreg_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + ["method=vcreg", "method.num_classes=10"],
    # A memory bank and k-means at the epoch's end (4 steps of 16): steps 5 and 6 learn the clusters.
    "deepclusterv2_vit": [o for o in TINY if not o.startswith("backbone")]
    + VIT
    + [o for o in ONE_STEP if "max_steps" not in o]
    + ["trainer.max_steps=6", "method=deepclusterv2", "method.num_prototypes=[4,6]", "method.kmeans_iterations=3"],
    # Groups moved by the whole batch's embeddings within the step, a queue, and a regrouping with the teacher reset
    # after step 2 (4 steps of 16).
    "smog_vit": [o for o in TINY if not o.startswith("backbone")]
    + VIT
    + [o for o in ONE_STEP if "max_steps" not in o]
    + [
        "trainer.max_steps=4",
        "method=smog",
        "method.pred_hidden_dim=32",
        "method.num_groups=4",
        "method.queue_size=32",
        "method.regroup_every=2",
        "method.kmeans_iterations=3",
    ],
    # Per-sample masks, split with the batch; the loss a mean over the masked patches of the whole batch.
    "mae_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + ["method=mae", "method.decoder_embed_dim=16", "method.decoder_depth=1", "method.decoder_heads=2"],
    # Multi-crop with per-sample block masks on the global crops; Sinkhorn-Knopp, iBOT and KoLeo over the whole batch.
    # Not the digits default's centres and head BatchNorm (tests/test_methods.py runs those): a bias before BatchNorm
    # has a true gradient of 0, and AdamW turns its float64 rounding into a whole step.
    "dinov2_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + [
        "method=dinov2",
        "method.centering=sinkhorn_knopp",
        "method.use_bn_in_head=false",
        "+backbone.kwargs.dynamic_img_size=true",
        "augmentation=multicrop_digits",
        "method.proj_hidden_dim=32",
        "method.bottleneck_dim=16",
        "method.num_prototypes=64",
        "method.freeze_last_layer_epochs=0",
        "method.mask_probability=0.8",
    ],
    # Per-sample context and target blocks, padded to the most they can hold; an EMA target encoder.
    "ijepa_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + [
        "method=ijepa",
        "method.predictor_embed_dim=16",
        "method.predictor_depth=1",
        "method.predictor_heads=2",
        "method.base_momentum=0.9",
    ],
    # Per-sample masks of whole squares (SimMIM) and per-sample prefixes (AIM: a prefix-causal attention mask per sample,
    # a different number of patches predicted per sample), split with the batch.
    "simmim_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + ["method=simmim", "method.mask_patch_size=8"],
    "aim_vit": [o for o in TINY if not o.startswith(("backbone", "method"))]
    + VIT
    + ONE_STEP
    + ["method=aim", "method.head_width=16", "method.head_depth=1"],
    "siglip_vit": [o for o in TINY if not o.startswith(("backbone", "method", "data"))]
    + VIT
    + ONE_STEP
    + [
        "method=siglip",
        "data=digits",
        "method.embed_dim=16",
        "method.text.width=32",
        "method.text.depth=1",
        "method.text.heads=2",
    ],
}


def moved(run_dir, overrides) -> tuple[dict, float]:
    """The weights after the run, and how far training moved them from their initialisation."""
    cfg = compose_cfg(overrides)
    torch.manual_seed(cfg.trainer.seed)
    start = {k: v.double() for k, v in build_model(cfg, 10).state_dict().items() if v.is_floating_point()}
    after = weights(run_dir)
    return after, max(float((after[k] - start[k]).abs().max()) for k in start)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.slow)
        if c in ("deepclusterv2_vit", "smog_vit", "simmim_vit", "aim_vit")
        else c
        for c in sorted(CASES)
    ],
)
def test_accumulated_step_equals_the_whole_batch_step(tmp_path, case):
    base = CASES[case] + ["data.batch_size=16"]
    pretrain(compose_cfg(base), tmp_path / "whole")
    pretrain(compose_cfg(base + ["trainer.accumulate=4"]), tmp_path / "k4")
    whole, movement = moved(tmp_path / "whole", base)
    other = weights(tmp_path / "k4")
    worst, name = max((float((whole[k] - other[k]).abs().max()), k) for k in whole)
    assert worst <= 1e-10 * movement, f"{name}: differs by {worst}, the step moved weights by {movement}"


@pytest.mark.slow
@pytest.mark.one_process
def test_the_centre_moves_once_per_step_not_per_micro_batch(tmp_path):
    """DINO's centre moves after the loss, from the whole batch's teacher outputs: trainer.accumulate=2 equals the
    whole-batch run over 3 steps, which read the moved centre. A centre moved once per micro-batch (as a loop that
    calls the whole forward per micro-batch does) ends elsewhere."""
    base = [o for o in CASES["dino_vit"] if "max_steps" not in o] + ["trainer.max_steps=3", "data.batch_size=16"]
    pretrain(compose_cfg(base), tmp_path / "whole")
    pretrain(compose_cfg(base + ["trainer.accumulate=2"]), tmp_path / "k2")
    wrong = [o for o in base if o != "method=dino"] + [
        "method=dino_centre_per_micro_batch",
        "imports=[tests.local_state_methods]",
        f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]",
        "trainer.accumulate=2",
    ]
    pretrain(compose_cfg(wrong), tmp_path / "wrong")
    whole, movement = moved(tmp_path / "whole", base)
    k2, wrong = (weights(tmp_path / d) for d in ("k2", "wrong"))
    assert max(float((whole[k] - k2[k]).abs().max()) for k in whole) <= 1e-10 * movement
    assert max(float((whole[k] - wrong[k]).abs().max()) for k in whole if k != "method.center") > 1e-6 * movement


@pytest.mark.slow
@pytest.mark.one_process
def test_ijepa_masks_are_not_cut_to_the_batch(tmp_path):
    """I-JEPA's masks, drawn per sample and padded, give trainer.accumulate=2 the whole batch's step over 3 steps;
    masks cut to the smallest in the batch at hand (I-JEPA's collator, per GPU) give each micro-batch other masks."""
    base = [o for o in CASES["ijepa_vit"] if "max_steps" not in o] + ["trainer.max_steps=3", "data.batch_size=16"]
    wrong = [o for o in base if o != "method=ijepa"] + [
        "method=ijepa_cut_to_batch",
        "imports=[tests.local_state_methods]",
        f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]",
    ]
    for name, overrides in [("right", base), ("wrong", wrong)]:
        pretrain(compose_cfg(overrides), tmp_path / name / "whole")
        pretrain(compose_cfg(overrides + ["trainer.accumulate=2"]), tmp_path / name / "k2")
    _, movement = moved(tmp_path / "right" / "whole", base)

    def worst(name: str) -> float:
        whole, k2 = (weights(tmp_path / name / d) for d in ("whole", "k2"))
        return max(float((whole[k] - k2[k]).abs().max()) for k in whole)

    assert worst("right") <= 1e-10 * movement
    assert worst("wrong") > 1e-6 * movement


@pytest.mark.slow
@pytest.mark.processes
def test_two_processes_accumulating_equal_one_process_on_the_whole_batch(tmp_path):
    base = CASES["simclr_vit"]
    pretrain(compose_cfg(base + ["data.batch_size=16"]), tmp_path / "w1")
    run(base + ["data.batch_size=8", "trainer.accumulate=2"], tmp_path / "w2", nproc=2)
    whole, movement = moved(tmp_path / "w1", base + ["data.batch_size=16"])
    other = weights(tmp_path / "w2")
    worst, name = max((float((whole[k] - other[k]).abs().max()), k) for k in whole)
    assert worst <= 1e-10 * movement, f"{name}: differs by {worst}, the step moved weights by {movement}"


class GhostBatchNorm(nn.Module):
    """The reference for a BatchNorm backbone: the same BatchNorm applied to each micro-batch of `chunk` samples, its
    rows of the call's `views` views (concatenated one after the other) together, as SimCLR's one call per
    micro-batch normalises them."""

    def __init__(self, bn: nn.BatchNorm2d, chunk: int, views: int):
        super().__init__()
        self.bn, self.chunk, self.views = bn, chunk, views

    def forward(self, x):
        from solo.distributed.batchnorm import row_groups

        per_view = [v.split(self.chunk) for v in x.chunk(self.views)]  # [view][micro-batch]
        with row_groups(self.bn, 1):  # each micro-batch's own statistics, whatever groups the call holds
            normalised = [self.bn(torch.cat(parts)).chunk(self.views) for parts in zip(*per_view)]
        return torch.cat([part for v in range(self.views) for part in (m[v] for m in normalised)])


@pytest.mark.slow
@pytest.mark.one_process
def test_a_batchnorm_backbone_sees_micro_batch_statistics(tmp_path, monkeypatch):
    """With BatchNorm in the backbone, accumulate=k equals the whole-batch step of a backbone whose BatchNorm
    takes its statistics over each micro-batch (ghost batch norm; SimCLR's: both views of the micro-batch together);
    the projector's BatchNorm and the loss still see the whole batch. It does not equal the plain whole-batch step."""
    base = TINY + ONE_STEP + ["data.batch_size=16"]
    pretrain(compose_cfg(base + ["trainer.accumulate=4"]), tmp_path / "k4")
    pretrain(compose_cfg(base), tmp_path / "plain")
    import solo.train.trainer as trainer

    def ghost_model(cfg, num_classes, backbone=None):
        model = build_model(cfg, num_classes, backbone)
        for _name, module in list(model.method.backbone.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, nn.BatchNorm2d):
                    setattr(module, child_name, GhostBatchNorm(child, 4, views=2))
        return model

    monkeypatch.setattr(trainer, "build_model", ghost_model)
    pretrain(compose_cfg(base), tmp_path / "ghost")
    k4, plain, ghost = (weights(tmp_path / d) for d in ("k4", "plain", "ghost"))
    ghost = {k.replace(".bn.", "."): v for k, v in ghost.items()}
    _, movement = moved(tmp_path / "plain", base)
    # The trained parameters; running statistics differ in update order (view by view, or micro-batch by micro-batch).
    trained = [k for k in k4 if "running_" not in k]
    assert max(float((k4[k] - ghost[k]).abs().max()) for k in trained) <= 1e-10 * movement
    assert max(float((k4[k] - plain[k]).abs().max()) for k in trained) > 1e-6 * movement


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.accumulate=0"], "trainer.accumulate=0: must be >= 1"),
        (["trainer.accumulate=3", "data.batch_size=16"], "trainer.accumulate=3 does not divide data.batch_size=16"),
    ],
)
def test_bad_accumulation_settings_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(TINY + overrides)


def test_a_method_without_an_encode_head_split_refuses_to_accumulate():
    from tests.test_lifecycle import TOY

    with pytest.raises(ConfigError, match="method=toy_ema cannot accumulate gradients exactly"):
        compose_cfg(TOY + ["trainer.accumulate=2"])


def test_a_tiled_loss_accumulated_equals_the_whole_untiled_batch(tmp_path):
    """method.loss_tile streams the loss over candidate tiles; with accumulation on top, still the same step."""
    base = CASES["simclr_vit"] + ["data.batch_size=16"]
    pretrain(compose_cfg(base), tmp_path / "plain")
    pretrain(compose_cfg(base + ["method.loss_tile=5", "trainer.accumulate=2"]), tmp_path / "tiled")
    whole, movement = moved(tmp_path / "plain", base)
    other = weights(tmp_path / "tiled")
    assert max(float((whole[k] - other[k]).abs().max()) for k in whole) <= 1e-10 * movement
    with pytest.raises(ConfigError, match="method.loss_tile=0: must be none, auto or a positive number"):
        compose_cfg(base + ["method.loss_tile=0"])


def test_a_run_resumes_with_another_number_of_micro_batches(tmp_path):
    base = TINY + ["data.batch_size=16", "trainer.log_every_steps=1"]
    pretrain(compose_cfg(base + ["trainer.max_steps=2"]), tmp_path)
    pretrain(compose_cfg(base + ["trainer.max_steps=4", "trainer.accumulate=4"]), tmp_path)  # same global batch
    from tests.test_train import metrics

    assert [m["step"] for m in metrics(tmp_path) if "train/loss" in m] == [1, 2, 3, 4]
