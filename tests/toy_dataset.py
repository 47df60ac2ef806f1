"""A dataset added from a file of its own, as a user would (README: Adding a dataset)."""

from solo.data import SyntheticDataset, register_dataset


@register_dataset("toy_stripes", stats=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
def toy_stripes(d, split: str, seed: int, pairs: bool):
    """48 images of 4 classes per split: anything indexable as (PIL image, label) with `.classes` will do."""
    return SyntheticDataset(48, d.image_size, num_classes=4, seed=seed + 1, split=split)
