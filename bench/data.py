#!/usr/bin/env python
"""Views/s of the augmentation pipeline alone: JPEG files -> two SimCLR views of 224 px, per worker (one thread).

    python bench/data.py                                   # solo's CPU and device paths, torchvision, a profile
    python bench/data.py --workers 8                       # + both paths through solo's loader with 8 workers
    python bench/data.py --solo-learn-venv .bench/solo-learn-venv --solo-learn .bench/solo-learn   # + solo-learn's
    python bench/data.py --device cuda                     # the device path on the GPU

Rows (each reads the same `--images` JPEG files of `--image-size` px from disk, page-cached, in the same order):
- solo, data.augment_on=cpu: what one DataLoader worker does for a batch, `MultiViewDataset.__getitems__`: read
  each file, decode it (decode_jpeg), draw each view's parameters, make each view of the whole batch at once.
- solo, data.augment_on=device: the worker's share (the raw MultiViewDataset: read, parse the JPEG header, draw
  the parameters; collate) and the device's share (DeviceViews: decode_jpeg of the batch, then the views of the
  whole batch, `--batch` at a time), timed apart.
- torchvision: the usual v2 pipeline on PIL images (RandomResizedCrop, flip, ColorJitter in RandomApply,
  RandomGrayscale, GaussianBlur(23) in RandomApply, to float, Normalize), the same probabilities and strengths.
- solo-learn (with --solo-learn-venv): its own pipeline (`build_transform_pipeline`, PIL transforms) and image
  loader, run by that environment's python.
- with --workers W: both of solo's paths end to end through its loader (the global-batch sampler and a DataLoader
  with W workers, a second pass over the images timed): the CPU path's views made by the workers, the device
  path's by DeviceViews on the device as the workers' raw batches arrive.
  Then the training process's CPU time per raw batch handed over by the workers (PackedImages: one tensor).
Then a profile of solo's CPU path: the time per view of each stage, on the same images; and how far solo's crop
(roi_align, solo.data.views.augment) is from torchvision's antialiased resized_crop of the same boxes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from solo.data import ImageFolderDataset, MultiViewDataset  # noqa: E402
from solo.data.decode import raw_image  # noqa: E402
from solo.data.sampling.seeding import seeded_rng  # noqa: E402
from solo.data.sampling.source import MapDataSource  # noqa: E402
from solo.data.views import augment  # noqa: E402
from solo.data.views.multiview import collate_raw  # noqa: E402
from solo.data.views.transforms import ViewAugmentation, build_view_transform  # noqa: E402

SIMCLR = ViewAugmentation(
    crop_scale=[0.08, 1.0],
    hflip_prob=0.5,
    jitter_prob=0.8,
    brightness=0.4,
    contrast=0.4,
    saturation=0.4,
    hue=0.1,
    grayscale_prob=0.2,
    blur_prob=0.5,
)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

SOLO_LEARN_SNIPPET = """
import sys, time, omegaconf
from PIL import Image
from solo.data.pretrain_dataloader import build_transform_pipeline, NCropAugmentation, FullTransformPipeline
cfg = omegaconf.OmegaConf.create(dict(rrc=dict(enabled=True, crop_min_scale=0.08, crop_max_scale=1.0),
    color_jitter=dict(prob=0.8, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1), grayscale=dict(prob=0.2),
    gaussian_blur=dict(prob=0.5), solarization=dict(prob=0.0), equalization=dict(prob=0.0),
    horizontal_flip=dict(prob=0.5), crop_size=224, num_crops=2))
transform = FullTransformPipeline([NCropAugmentation(build_transform_pipeline("custom", cfg), 2)])
files = sys.argv[1:]
def load(path):  # torchvision's default_loader, as solo-learn's ImageFolder uses
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")
transform(load(files[0]))
start = time.perf_counter()
for path in files:
    transform(load(path))
print(2 * len(files) / (time.perf_counter() - start))
"""


def make_images(folder: Path, count: int, size: int) -> list[Path]:
    """An ImageFolder train split (one class) of `count` JPEGs, 4:3 as most photographs, written once."""
    from solo.data import SyntheticDataset

    (folder / "train" / "all").mkdir(parents=True, exist_ok=True)
    paths = [folder / "train" / "all" / f"{i:05d}.jpg" for i in range(count)]
    if not all(p.exists() for p in paths):
        images = SyntheticDataset(count, size, num_classes=10, seed=0)
        for i, path in enumerate(paths):
            images[i][0].resize((size * 4 // 3, size)).save(path, quality=90)
    return paths


def rate(views: int, seconds: float) -> float:
    return views / seconds


def batches(count: int, batch: int) -> list[list[tuple[int, int]]]:
    keys = [(0, i) for i in range(count)]  # (epoch, index), as the global-batch sampler gives them
    return [keys[i : i + batch] for i in range(0, count, batch)]


def solo_datasets(folder: Path, view_size: int) -> tuple[MultiViewDataset, MultiViewDataset]:
    """solo's two SimCLR views of `view_size` px of the ImageFolder train split at `folder`: the CPU path's dataset
    (data.augment_on=cpu) and the device path's raw one (data.augment_on=device)."""
    recipes = [build_view_transform(SIMCLR, view_size, MEAN, STD) for _ in range(2)]
    images = ImageFolderDataset(str(folder), "train")
    cpu, raw = (MultiViewDataset(images, recipes, seed=0, raw=r) for r in (False, True))
    return cpu, raw


def solo_cpu(dataset: MultiViewDataset, batch: int, count: int | None = None) -> float:
    """What a DataLoader worker does for a batch (MultiViewDataset.__getitems__): read each file, decode it, draw
    each view's parameters, make each view of the whole batch at once; over the first `count` images (all)."""
    count = count or len(dataset)
    start = time.perf_counter()
    for keys in batches(count, batch):
        dataset.__getitems__(keys)
    return rate(2 * count, time.perf_counter() - start)


def solo_device(
    dataset: MultiViewDataset, batch: int, device: torch.device, count: int | None = None
) -> tuple[float, float]:
    """(views/s of the worker's share: read, JPEG header, parameters, collate; views/s of the device's share:
    DeviceViews, the decode and the views of the batch), for a raw MultiViewDataset; over the first `count`
    images (all)."""
    count = count or len(dataset)
    make_views = augment.DeviceViews(dataset.view_transforms, pairs=False)
    make_views(collate_raw(dataset.__getitems__(batches(count, batch)[0])), device)  # the decoder's and kernels' set-up
    worker, on_device = 0.0, 0.0
    for keys in batches(count, batch):
        start = time.perf_counter()
        raw = collate_raw(dataset.__getitems__(keys))
        worker += time.perf_counter() - start
        start = time.perf_counter()
        make_views(raw, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        on_device += time.perf_counter() - start
    return rate(2 * count, worker), rate(2 * count, on_device)


def solo_loader(dataset: MultiViewDataset, batch: int, workers: int, device: torch.device) -> float:
    """Views/s of solo's loader over `dataset` with `workers` DataLoader workers, the second of two passes (the
    workers started): the views made by the workers, or for a raw dataset by DeviceViews on `device`."""
    raw = dataset.raw
    source = MapDataSource(
        dataset,
        batch,
        0,
        1,
        seed=0,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
        **({"collate_fn": collate_raw} if raw else {}),
    )
    make_views = augment.DeviceViews(dataset.view_transforms, pairs=False) if raw else None
    for epoch in range(2):
        source.set_epoch(epoch)
        start = time.perf_counter()
        for batch_read in source:
            if make_views:
                make_views(batch_read, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    stop_workers(source)
    return rate(2 * source.steps_per_epoch * batch, seconds)


def received(dataset: MultiViewDataset, batch: int, workers: int) -> float:
    """Milliseconds of the training process's CPU per raw batch taken from `workers` DataLoader workers (the views not
    made): the batches of an epoch, the workers given time to read them ahead first, so that only the hand-over is
    timed (the batch's tensors out of shared memory)."""
    source = MapDataSource(
        dataset, batch, 0, 1, seed=0, num_workers=workers, persistent_workers=True, collate_fn=collate_raw
    )
    for _ in source:  # the workers started
        pass
    source.set_epoch(1)
    batches = iter(source)
    next(batches)
    time.sleep(2.0)
    start = time.process_time()
    count = sum(1 for _ in batches)
    seconds = time.process_time() - start
    stop_workers(source)
    return 1e3 * seconds / max(count, 1)


def stop_workers(source: MapDataSource) -> None:
    """End the loader's persistent workers now (left to the garbage collector, each took 5 s to stop)."""
    if getattr(source.loader, "_iterator", None) is not None:
        source.loader._iterator._shutdown_workers()


def torchvision_pipeline(paths, view_size: int) -> float:
    from torchvision.transforms import v2

    a = SIMCLR
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(view_size, scale=tuple(a.crop_scale), antialias=True),
            v2.RandomHorizontalFlip(a.hflip_prob),
            v2.RandomApply([v2.ColorJitter(a.brightness, a.contrast, a.saturation, a.hue)], p=a.jitter_prob),
            v2.RandomGrayscale(a.grayscale_prob),
            v2.RandomApply([v2.GaussianBlur(23, sigma=(0.1, 2.0))], p=a.blur_prob),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(MEAN), list(STD)),
        ]
    )
    start = time.perf_counter()
    for path in paths:
        with Image.open(path) as img:
            image = img.convert("RGB")
        transform(image), transform(image)
    return rate(2 * len(paths), time.perf_counter() - start)


def solo_learn(paths, venv: Path, checkout: Path) -> float:
    python, checkout = venv.resolve() / "bin" / "python", checkout.resolve()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [str(python), "-c", SOLO_LEARN_SNIPPET, *map(str, paths)], cwd=checkout, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


def profile(paths, recipe) -> list[tuple[str, float]]:
    """Milliseconds per view of each stage of solo's CPU path (every operation applied, to time it)."""
    stages: dict[str, float] = {}

    def clock(name, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - start
        return out

    cpu = torch.device("cpu")
    one, zero = torch.ones(1, 1, 1, 1), torch.zeros(1, 1, 1, 1)
    for i, path in enumerate(paths):
        data = clock("read file", path.read_bytes)
        encoded, height, width = clock("parse the JPEG header", raw_image, data, str(path))
        pixels = clock("decode JPEG (decode_jpeg)", augment.decode, [encoded], cpu)[0]
        with seeded_rng(i):
            p = clock("draw parameters", recipe.draw, height, width)
        canvas = clock("place in the batch's canvas", augment.padded_canvas, [pixels], cpu)
        top, left, h, w = p[: augment.PARAM_INDEX["width"] + 1]
        box = torch.tensor([[0.0, left, top, left + w, top + h]])
        x = clock("crop + resize (roi_align)", augment.crop_resize, canvas, box, recipe.size)
        x = clock("flip", torch.flip, x, (-1,))
        for name, factors in (("brightness", (0.9 * one, zero)), ("contrast", (0.9 * one, 0.1 * one))):
            x = clock(name, augment.blend, x, *factors)
        x = clock("saturation", augment.blend, x, 0.9 * one, zero, 0.1 * one)
        x = clock("hue", augment.shift_hue, x, torch.full((1, 1, 1, 1), 0.3))
        x = clock("grayscale", lambda t: augment.grey(t).expand_as(t), x)
        taps = torch.from_numpy(augment._blur_weights(np.array([1.0]), recipe.kernel)).repeat(3, 1)
        x = clock(f"blur ({recipe.kernel} taps, separable)", augment.gaussian_blur, x, taps[None])
        clock("normalise", lambda t: (t - 0.5) / 0.25, x)
    return [(name, 1e3 * seconds / len(paths)) for name, seconds in stages.items()]


def numerics(paths, recipe) -> list[str]:
    """How far solo's crop (roi_align on the image) is from torchvision's resized_crop (antialiased) of the same box,
    in [0, 1] pixel units, over one view of each image: boxes upsampled to the view and boxes downsampled apart."""
    from torchvision.transforms.v2 import functional as TF

    cpu, found = torch.device("cpu"), {"upsampled": [], "downsampled": []}
    for i, path in enumerate(paths):
        encoded, height, width = raw_image(path.read_bytes(), str(path))
        pixels = augment.decode([encoded], cpu)[0]
        with seeded_rng(i):
            p = recipe.draw(height, width)
        top, left, h, w = (int(v) for v in p[: augment.PARAM_INDEX["width"] + 1])
        box = torch.tensor([[0.0, left, top, left + w, top + h]])
        ours = augment.crop_resize(augment.padded_canvas([pixels], cpu), box, recipe.size)[0]
        theirs = TF.resized_crop(pixels.float(), top, left, h, w, [recipe.size] * 2, antialias=True) / 255
        difference = (ours - theirs).abs()
        kind = "upsampled" if max(h, w) <= recipe.size else "downsampled"
        found[kind].append((float(difference.mean()), float(difference.max()), float(difference[:, 1:-1, 1:-1].mean())))
    lines = [
        "| boxes | views | mean difference | largest | mean without the outermost pixels |",
        "|---|---|---|---|---|",
    ]
    for kind, rows in found.items():
        if rows:
            means, largest, inner = zip(*rows)
            lines.append(f"| {kind} | {len(rows)} | {np.mean(means):.4f} | {max(largest):.3f} | {np.mean(inner):.4f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=300, help="height; width is 4/3 of it")
    parser.add_argument("--view-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64, help="samples per batch (a worker's, or the device's)")
    parser.add_argument("--workers", type=int, default=0, help="> 0: also both paths through a loader with as many")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--folder", type=Path, default=REPO / ".bench" / "views", help="where the JPEGs are written")
    parser.add_argument("--solo-learn-venv", type=Path)
    parser.add_argument("--solo-learn", type=Path, default=REPO / ".bench" / "solo-learn", help="its checkout")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one DataLoader worker
    paths = make_images(args.folder, args.images, args.image_size)
    cpu, raw = solo_datasets(args.folder, args.view_size)
    cpu.__getitems__(batches(8, 8)[0])  # warm the page cache and the kernels
    print(
        f"{args.images} JPEGs of {args.image_size * 4 // 3}x{args.image_size} px -> 2 views of {args.view_size} px, "
        f"one thread, {os.cpu_count()} CPUs; device path on {args.device}"
    )
    print("| pipeline | views/s |\n|---|---|")
    print(
        f"| solo, data.augment_on=cpu (a worker's batch of {args.batch}) | {solo_cpu(cpu, args.batch):,.0f} |",
        flush=True,
    )
    worker, device = solo_device(raw, args.batch, torch.device(args.device))
    print(f"| solo, data.augment_on=device: the worker's share (read, JPEG header, parameters) | {worker:,.0f} |")
    print(
        f"| solo, data.augment_on=device: the device's share on {args.device} (decode, views; batch {args.batch}) | {device:,.0f} |"
    )
    if args.workers:
        for name, dataset in (("cpu: views by the workers", cpu), (f"device: views on {args.device}", raw)):
            got = solo_loader(dataset, args.batch, args.workers, torch.device(args.device))
            print(f"| solo, data.augment_on={name}, through its loader with {args.workers} workers | {got:,.0f} |")
        print(
            f"\nThe training process's CPU per raw batch of {args.batch} from {args.workers} workers (data.augment_on="
            f"device, the views not made): {received(raw, args.batch, args.workers):.2f} ms"
        )
    print(f"| torchvision v2 on PIL images | {torchvision_pipeline(paths, args.view_size):,.0f} |", flush=True)
    if args.solo_learn_venv:
        print(f"| solo-learn (PIL transforms) | {solo_learn(paths, args.solo_learn_venv, args.solo_learn):,.0f} |")
    print("\nsolo's CPU path, per view (every operation applied, to time it):\n| stage | ms |\n|---|---|")
    for name, ms in profile(paths, cpu.view_transforms[0]):
        print(f"| {name} | {ms:.2f} |")
    print("\nsolo's crop against torchvision's resized_crop (antialiased) of the same box, [0, 1] pixel units:")
    print("\n".join(numerics(paths, cpu.view_transforms[0])))


if __name__ == "__main__":
    main()
