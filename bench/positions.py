"""How much of a ViT's patch tokens tells where the patch is, fitted on the digits' train split and scored on the val
split: the squared error of a regressor as one of RASA's stages trains it (linear, no bias, a sigmoid, from zero;
Adam at 2e-3, STEPS full-batch steps), beside that of predicting the grid's mean (chance); and the R^2 of the
least-squares linear map with a bias, in float64 (every direction, however small its variance). method=rasa removes
what the first reads (docs/methods/rasa.md).

    python bench/positions.py franca-digits-vittiny6 rasa-digits-vittiny6 [<run dir | weights file> ...]
"""

import argparse

import numpy as np
import torch

from solo.data.sources.images import DigitsDataset
from solo.losses import position_loss
from solo.methods.rasa import grid_positions
from solo.zoo.pretrained import resolve


def digits(split: str, pretrained) -> torch.Tensor:
    data = DigitsDataset(split, pretrained.data["image_size"])
    images = torch.tensor(np.stack(data.images)).permute(0, 3, 1, 2).float() / 255
    mean, std = (torch.tensor(pretrained.data[k]).view(1, 3, 1, 1) for k in ("mean", "std"))
    return (images - mean) / std


@torch.no_grad()
def patch_tokens(vit, images: torch.Tensor) -> torch.Tensor:
    return vit.forward_features(images)[:, vit.num_prefix_tokens :].double()


STEPS = 500


def regressor_error(train: torch.Tensor, val: torch.Tensor, positions: torch.Tensor) -> float:
    weight = torch.zeros(2, train.shape[-1], dtype=train.dtype, requires_grad=True)
    optimizer = torch.optim.Adam([weight], lr=2e-3)
    for _ in range(STEPS):
        optimizer.zero_grad()
        position_loss(torch.sigmoid(train @ weight.T), positions).backward()
        optimizer.step()
    with torch.no_grad():
        return float(position_loss(torch.sigmoid(val @ weight.T), positions))


def least_squares_r2(train: torch.Tensor, val: torch.Tensor, positions: torch.Tensor) -> float:
    def rows(tokens):
        flat = tokens.flatten(0, 1)
        return torch.cat([flat, torch.ones(len(flat), 1, dtype=flat.dtype)], dim=1)

    fit = torch.linalg.lstsq(rows(train), positions.repeat(len(train), 1)).solution
    target = positions.repeat(len(val), 1)
    return float(1 - (rows(val) @ fit - target).pow(2).sum() / (target - target.mean(dim=0)).pow(2).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="zoo names, run directories or weights files of digits ViTs")
    for source in parser.parse_args().sources:
        pretrained = resolve(source)
        vit = pretrained.build_backbone().eval()
        train, val = (patch_tokens(vit, digits(split, pretrained)) for split in ("train", "val"))
        positions = grid_positions(*vit.patch_embed.grid_size)
        chance = float((positions - positions.mean(dim=0)).pow(2).mean())
        print(
            f"{source}: regressor's error {regressor_error(train, val, positions):.4f} (chance {chance:.4f}), "
            f"least-squares R^2 {least_squares_r2(train, val, positions):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
