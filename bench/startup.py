#!/usr/bin/env python
"""How long training takes to begin on a large corpus: a captions CSV (data=csv, CLIP) and a Parquet dataset
(data=huggingface, SimCLR), each of `--rows` rows (default 1,000,000).

    python bench/startup.py                 # 1,000,000 rows each
    python bench/startup.py --rows 100000

The rows point at (CSV) or hold (Parquet: the PNG bytes, each row's made distinct by 4 bytes after the PNG's end,
so that Parquet cannot store them once) 100 small generated images, over and over: what is measured is what grows
with the number of rows, not the images. For each: the time from the validated config to
the end of the first training step, in this process (`Trainer(...)`: the dataset opened, its first
data.check_images images decoded, the sampler's first epoch order, the model built; then the first batch read and
trained on), twice for Parquet (the first start converts the Parquet files to Arrow in the datasets cache, later
starts open that cache), and from launching `python main_pretrain.py ...` to its first step's line in
metrics.jsonl (interpreter and imports included).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

COMMON = [
    "backbone=resnet18_half",
    "data.image_size=16",
    "data.batch_size=64",
    "data.num_workers=0",
    "trainer.max_steps=1",
    "trainer.plots=false",
    "trainer.progress_bar=false",
    "trainer.probe=false",
]


def write_images(folder: Path, count: int = 100) -> list[Path]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        paths.append(folder / f"{i:03d}.png")
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def write_csv(file: Path, images: list[Path], rows: int) -> None:
    with open(file, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption", "label"])
        writer.writerows(
            [f"images/{images[i % len(images)].name}", f"a picture, number {i}", i % 10] for i in range(rows)
        )


def write_parquet(folder: Path, images: list[Path], rows: int, per_file: int = 250_000) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    schema = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}).arrow_schema
    encoded = [p.read_bytes() for p in images]
    for k, start in enumerate(range(0, rows, per_file)):
        ids = range(start, min(rows, start + per_file))
        table = pa.table(
            {
                "image": pa.array(
                    [{"bytes": encoded[i % len(encoded)] + i.to_bytes(4, "little"), "path": None} for i in ids],
                    type=schema.field("image").type,
                ),
                "label": pa.array([i % 10 for i in ids], type=pa.int64()),
            },
            schema=schema,
        )
        pq.write_table(table, folder / f"train-{k:05d}-of-{-(-rows // per_file):05d}.parquet")


def to_first_step(overrides: list[str], run_dir: Path) -> float:
    """Seconds from the validated config to the end of the first training step, in this process."""
    from hydra import compose, initialize_config_dir

    from solo.config import register_configs, validate_pretrain
    from solo.distributed.env import process_group
    from solo.train.trainer import Trainer

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        cfg = validate_pretrain(compose("pretrain", overrides=overrides))
    with process_group() as (env, device):
        start = time.perf_counter()
        Trainer(cfg, run_dir, env, device).fit()
        return time.perf_counter() - start


def command_seconds(overrides: list[str], run_dir: Path) -> float:
    """Seconds from launching `python main_pretrain.py ...` to the first step's line in its metrics.jsonl."""
    start = time.time()
    subprocess.run(
        [sys.executable, "main_pretrain.py", *overrides, "trainer.log_every_steps=1", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return first["time"] - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(tmp / "hf-cache")
        images = write_images(tmp / "images")
        started = time.perf_counter()
        write_csv(tmp / "captions.csv", images, args.rows)
        write_parquet(tmp / "parquet", images, args.rows)
        print(
            f"{args.rows:,} rows written in {time.perf_counter() - started:.0f} s: CSV "
            f"{(tmp / 'captions.csv').stat().st_size / 2**20:.0f} MiB, Parquet "
            f"{sum(p.stat().st_size for p in (tmp / 'parquet').iterdir()) / 2**20:.0f} MiB; {os.cpu_count()} CPUs"
        )
        runs = {
            "csv (clip)": COMMON
            + ["method=clip", "augmentation=clip", "data=csv", f"data.file={tmp / 'captions.csv'}"],
            "huggingface, Parquet (simclr)": COMMON
            + ["data=huggingface", f"data.path={tmp / 'parquet'}", "data.val_split=null"],
        }
        print("| source | to the first step, first start (s) | again (s) | the command, launch to first step (s) |")
        print("|---|---|---|---|")
        for name, overrides in runs.items():
            first = to_first_step(overrides, tmp / f"run-{len(name)}-a")
            again = to_first_step(overrides, tmp / f"run-{len(name)}-b")
            whole = command_seconds(overrides, tmp / f"run-{len(name)}-c")
            print(f"| {name} | {first:.1f} | {again:.1f} | {whole:.1f} |", flush=True)


if __name__ == "__main__":
    main()
