#!/usr/bin/env python
"""MAE's training step against a bare timm ViT on the same visible tokens with the same decoder.

    python bench/mae.py [--model vit_base_patch16_224] [--image-size 224] [--batch 8] [--steps 5] [--threads 2]

solo: `method=mae`'s module (solo.methods.mae.MAE; the probe's whole-image pass off, as with trainer.probe=false), its
forward and backward on a batch of images and per-sample masks (75% of the patches). Bare: the same ViT and decoder
modules called the way MAE's reference code does (patch embedding, position embedding, boolean-index the visible
tokens, class token, timm's blocks and norm, the decoder, a per-rank masked mean), forward and backward. Both in
float32 and under CPU autocast to bf16; the best of `--steps` timed steps of each, interleaved after one warm-up
step each. Prints ms per step and solo / bare.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # solo, from a checkout too

from solo.backbones import create_backbone  # noqa: E402
from solo.backbones.vit import patchify  # noqa: E402
from solo.losses import normalised_patches  # noqa: E402
from solo.methods.mae import MAE, MAEConfig  # noqa: E402


def bare_loss(model: MAE, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MAE's reference step written directly on timm's modules: no solo function on the path."""
    vit = model.backbone
    x = vit.patch_embed(images) + vit.pos_embed[:, 1:]
    x = x[~mask].reshape(len(images), -1, x.shape[-1])
    cls = (vit.cls_token + vit.pos_embed[:, :1]).expand(len(images), -1, -1)
    x = vit.norm(vit.blocks(torch.cat([cls, x], dim=1)))
    prediction = model.decoder(x, mask)
    target = normalised_patches(patchify(images, model.patch))
    return ((prediction - target) ** 2).mean(dim=-1)[mask].mean()


def solo_loss(model: MAE, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    batch = {"views": [images], "mask": mask, "label": torch.zeros(len(images), dtype=torch.long)}
    return model(batch)["loss"]


def best_times(steps: dict, repeats: int) -> dict:
    """The best wall time of each step function over `repeats`, the functions interleaved (one warm-up each first),
    so that drifts of the machine fall on all of them alike."""
    for step in steps.values():
        step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vit, width = create_backbone(args.model, img_size=args.image_size)
    model = MAE(vit, width, MAEConfig())  # the paper's decoder: 8 blocks of 512, 16 heads
    model.feeds_probe = False
    masks = model.mask_generator()
    images = torch.randn(args.batch, 3, args.image_size, args.image_size)
    mask = torch.stack([masks() for _ in range(args.batch)])
    print(
        f"{args.model} at {args.image_size} px, batch {args.batch}, {masks.num_patches - masks.hidden} visible of "
        f"{masks.num_patches} patches, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(f"{'precision':<10} {'bare ms':>9} {'solo ms':>9} {'solo / bare':>12}")
    for precision in ("fp32", "bf16"):

        def step(loss_fn, bf16=precision == "bf16"):
            def run():
                model.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = loss_fn(model, images, mask)
                loss.backward()

            return run

        best = best_times({"bare": step(bare_loss), "solo": step(solo_loss)}, args.steps)
        bare, ours = best["bare"], best["solo"]
        print(f"{precision:<10} {bare * 1e3:>9.0f} {ours * 1e3:>9.0f} {ours / bare:>12.3f}")


if __name__ == "__main__":
    main()
