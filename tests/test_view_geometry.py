"""`batch["view_boxes"]` (solo.data.views.batch_spec.ViewBoxes) says where each view lies in its image: read back
from the views of an image whose pixels hold their own coordinates, on the CPU path and on the device path alike."""

import pytest
import torch
from torch.utils.data import default_collate

from solo.data.views.augment import DeviceViews
from solo.data.views.batch_spec import ViewBoxes
from solo.data.views.multiview import MultiViewDataset, collate_raw
from solo.data.views.transforms import ViewAugmentation, build_view_transform

SIDE, VIEW = 64, 16
STEP = 3  # grey levels per pixel: the ramps stay below 255


class Ramps:
    """Images whose red channel is STEP x the pixel's row and green STEP x its column (rows and columns from 0)."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        rows = torch.arange(SIDE).view(SIDE, 1).expand(SIDE, SIDE) * STEP
        image = torch.stack([rows, rows.T, torch.zeros_like(rows)]).to(torch.uint8)
        return image, index


def recipes():
    # Crops and flips only: every other operation would change the ramps' values.
    aug = ViewAugmentation(crop_scale=[0.3, 0.9], hflip_prob=0.5, jitter_prob=0.0, grayscale_prob=0.0)
    return [build_view_transform(aug, VIEW, [0.0] * 3, [1.0] * 3) for _ in range(2)]


def read_back(view: torch.Tensor) -> list[float]:
    """(top, left, height, width, flip) in image units from a view of a Ramps image: an antialiased bilinear resize
    keeps a linear ramp linear away from the edges, so view pixel i's value is the ramp at the image row (or column)
    top + (i + 0.5) * height / VIEW - 0.5 (pixel centres at integers); two interior pixels give top and height."""
    i, j = 5, 10
    out = []
    for line in (view[0, :, VIEW // 2], view[1, VIEW // 2, :]):
        at = line.double() * 255 / STEP
        length = (at[j] - at[i]) * VIEW / (j - i)  # negative where the view runs right to left
        start = at[i] + 0.5 - (i + 0.5) * length / VIEW
        out += [min(start, start + length), abs(length)]
    flip = float(view[1, VIEW // 2, j] < view[1, VIEW // 2, i])
    return [out[0] / SIDE, out[2] / SIDE, out[1] / SIDE, out[3] / SIDE, flip]


def cpu_batch(keys):
    dataset = MultiViewDataset(Ramps(), recipes(), seed=3, fields=(ViewBoxes(),))
    return default_collate(dataset.__getitems__(keys))


def device_batch(keys):
    dataset = MultiViewDataset(Ramps(), recipes(), seed=3, raw=True, fields=(ViewBoxes(),))
    return DeviceViews(recipes(), pairs=False)(collate_raw(dataset.__getitems__(keys)), torch.device("cpu"))


@pytest.mark.parametrize("make", [cpu_batch, device_batch], ids=["cpu", "device"])
def test_view_boxes_are_where_the_views_show_the_image(make):
    batch = make([(0, i) for i in range(4)])
    boxes = batch["view_boxes"]
    assert boxes.shape == (4, 2, 5)
    flips = set()
    for b in range(4):
        for v in range(2):
            seen = read_back(batch["views"][v][b])
            assert seen == pytest.approx(boxes[b, v].tolist(), abs=0.02), (b, v)
            flips.add(seen[4])
    assert flips == {0.0, 1.0}  # both kinds seen, so a box that ignored its flip would have failed


def test_view_boxes_are_absent_unless_asked():
    dataset = MultiViewDataset(Ramps(), recipes(), seed=3)
    assert "view_boxes" not in dataset[(0, 0)]
