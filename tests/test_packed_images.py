"""A raw batch's images of several sizes cross from the DataLoader's workers as one tensor (PackedImages) and come
back as the images they were: their values, shapes and memory layouts; the views made from a packed batch read by
worker processes are the views of the same samples read in this process as a list of tensors."""

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from solo.data import ImageFolderDataset, MultiViewDataset
from solo.data.views.augment import DeviceViews
from solo.data.views.multiview import collate_raw
from solo.data.views.packed import PackedImages
from solo.data.views.transforms import ViewAugmentation, build_view_transform


def test_unpacked_images_are_the_packed_ones_in_their_own_memory_layout():
    generator = torch.Generator().manual_seed(0)
    encoded = torch.randint(0, 256, (1234,), dtype=torch.uint8, generator=generator)
    planar = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=generator)
    pixel_major = torch.randint(0, 256, (6, 4, 3), dtype=torch.uint8, generator=generator).permute(2, 0, 1)
    cut = torch.randint(0, 256, (3, 9, 9), dtype=torch.uint8, generator=generator)[:, 1:7:2, 2:5]  # not dense
    images = [encoded, planar, pixel_major, cut]
    packed = PackedImages.pack(images)
    assert packed.data.numel() == sum(im.numel() for im in images)  # one tensor, no padding
    unpacked = packed.unpack()
    for image, back in zip(images, unpacked):
        assert back.shape == image.shape and torch.equal(back, image)
        assert back.data_ptr() >= packed.data.data_ptr()  # a view of the packed bytes, not a copy
    # The pixel-major image keeps its (H, W, 3) memory (decode_jpeg's layout on the CPU): its bytes as they lie.
    assert unpacked[2].stride() == pixel_major.stride()
    start = encoded.numel() + planar.numel()
    assert torch.equal(packed.data[start : start + 72], pixel_major.permute(1, 2, 0).reshape(-1))
    assert not torch.equal(packed.data[start : start + 72], pixel_major.reshape(-1))  # the logical order differs


def _photos(folder, sizes):
    """JPEGs of the given sizes (kept encoded for the device) and one PNG (decoded in the worker)."""
    rng = np.random.default_rng(0)
    (folder / "train" / "a").mkdir(parents=True)
    for i, (w, h) in enumerate(sizes):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "train" / "a" / f"{i}.{'png' if i == 2 else 'jpg'}")
    return ImageFolderDataset(str(folder), "train")


def test_a_batch_read_by_workers_makes_the_views_of_the_same_samples_read_here(tmp_path):
    images = _photos(tmp_path, [(40, 30), (33, 47), (36, 28), (50, 50), (29, 31)])
    aug = ViewAugmentation(crop_scale=[0.3, 1.0])
    recipes = [build_view_transform(aug, 16, [0.5] * 3, [0.25] * 3) for _ in range(2)]
    raw = MultiViewDataset(images, recipes, seed=4, raw=True)
    keys = [(1, i) for i in range(len(images))]
    loader = DataLoader(raw, batch_sampler=[keys], num_workers=2, collate_fn=collate_raw)
    (batch,) = list(loader)
    assert isinstance(batch["image"], PackedImages)
    here = collate_raw(raw.__getitems__(keys))
    here["image"] = [sample["image"] for sample in raw.__getitems__(keys)]  # one tensor each, as before packing
    assert sum(im.dim() == 1 for im in here["image"]) == 4  # the JPEGs still encoded, the PNG decoded
    make = DeviceViews(recipes, pairs=False)
    got, expected = make(batch, torch.device("cpu")), make(here, torch.device("cpu"))
    for v in range(2):
        torch.testing.assert_close(got["views"][v], expected["views"][v], rtol=0, atol=0)
    assert torch.equal(got["index"], expected["index"])
