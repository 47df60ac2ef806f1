"""Where each cell of a view's feature map lies in the image: what local methods (VICRegL) pair the views' cells by.

A view is its crop box in the image and its flip (solo.data.views.batch_spec.view_boxes, `batch["view_boxes"]`): the
view's pixel (v, u), in units of its height and width, shows the image at (top + height * v, left + width * u), with
u -> 1 - u first where the view is mirrored. Cell (r, c) of an h x w map covers the view's [r / h, (r + 1) / h) x
[c / w, (c + 1) / w), the input of a stride-s network cut into h x w equal parts (the receptive fields' centres).
"""

from __future__ import annotations

import torch


def cell_centres(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The image coordinates (y, x), in units of the image's height and width, of the centres of the cells of each
    view's `height` x `width` map: (B, height * width, 2), cells in row-major order (as map.flatten(2)). `boxes`: the
    views' (B, 5) geometry (top, left, height, width, flip)."""
    boxes = boxes.to(torch.float64)
    v = (torch.arange(height, dtype=boxes.dtype, device=boxes.device) + 0.5) / height
    u = (torch.arange(width, dtype=boxes.dtype, device=boxes.device) + 0.5) / width
    top, left, box_height, box_width, flip = boxes.unbind(1)
    u = torch.where(flip[:, None] > 0, 1 - u, u)  # (B, width): a mirrored view's column c shows the box's w - 1 - c
    y = top[:, None] + box_height[:, None] * v  # (B, height)
    x = left[:, None] + box_width[:, None] * u  # (B, width)
    return torch.stack(torch.broadcast_tensors(y[:, :, None], x[:, None, :]), dim=-1).flatten(1, 2)


def in_image_orientation(maps: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Each view's map (B, C, h, w) with a mirrored view's columns put back (`boxes`: the views' (B, 5) geometry)."""
    return torch.where(boxes[:, 4, None, None, None] > 0, maps.flip(-1), maps)


def resampled_over(maps: torch.Tensor, boxes: torch.Tensor, inner: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Each view's map (B, C, h, w), in the image's orientation (a mirrored view's columns put back), resampled over
    the `inner` box (B, 5, in image units; its flip not read) onto a `size` grid: (B, C, *size), bilinear samples
    averaged per output cell (torchvision's roi_align, aligned). PaKA's alignment of a local crop's cells with the
    global crop it was drawn inside (LightlyTrain's DINOv3.1). `boxes`: the views' (B, 5) geometry."""
    from torchvision.ops import roi_align

    h, w = maps.shape[-2:]
    boxes, inner = boxes.to(maps.dtype), inner.to(maps.dtype)
    maps = in_image_orientation(maps, boxes)
    top, left, height, width = boxes[:, :4].unbind(1)
    y0, x0 = (inner[:, 0] - top) / height * h, (inner[:, 1] - left) / width * w
    y1, x1 = (inner[:, 0] + inner[:, 2] - top) / height * h, (inner[:, 1] + inner[:, 3] - left) / width * w
    rows = torch.arange(len(maps), dtype=maps.dtype, device=maps.device)
    return roi_align(maps, torch.stack([rows, x0, y0, x1, y1], dim=1), size, aligned=True)
