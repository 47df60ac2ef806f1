"""What VCReg regularises, measured: each block's output on the digits val split (eval mode) for the given zoo
entries or run directories, every token or position a row, as solo.methods.vcreg reads them.

    python bench/block_statistics.py outputs/zoo/vcreg-digits-resnet18half <a supervised run dir>

Per block: its width d, the mean over features of the variance hinge max(0, 1 - sqrt(var + 1e-4)), and the mean
absolute correlation between two different features."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import solo.zoo  # noqa: E402
from solo.backbones import blocks_of, pooled_and_block_outputs  # noqa: E402
from solo.data.sources.images import DigitsDataset  # noqa: E402
from solo.methods.vcreg import block_rows  # noqa: E402


@torch.no_grad()
def block_statistics(source: str) -> list[str]:
    model, transform = solo.zoo.load(source).eval(), solo.zoo.eval_transform(source)
    data = DigitsDataset("val", 16)
    images = torch.stack([transform(data[i][0]) for i in range(len(data))])
    _, outputs = pooled_and_block_outputs(model, images, blocks_of(model))
    rows = []
    for output in outputs:
        cov = torch.cov(block_rows(output).double().T)
        d, std = cov.shape[0], cov.diagonal().clamp_min(0).sqrt()
        corr = cov / (std[:, None] * std[None, :]).clamp_min(1e-12)
        off_diagonal = (corr - torch.diag(corr.diagonal())).abs().sum() / (d * (d - 1))
        hinge = torch.relu(1 - torch.sqrt(cov.diagonal() + 1e-4)).mean()
        rows.append(f"d {d}: hinge {hinge:.3f}, |corr| {off_diagonal:.3f}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="zoo entries or run directories")
    for source in parser.parse_args().sources:
        print(source, "|", " | ".join(block_statistics(source)))
