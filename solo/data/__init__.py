"""Data pipeline: base datasets (one registry, solo.data.registry), augmentations, per-sample seeded multi-view wrappers and
the stateful data sources the trainer reads batches from."""

from solo.data.datasets import (
    CIFAR10Dataset,
    CIFAR100Dataset,
    DigitsDataset,
    ImageFolderDataset,
    ImageReadError,
    SyntheticDataset,
)
from solo.data.image_text import (
    DIGIT_TEMPLATES,
    CsvPairs,
    DigitsPairs,
    ImageTextDataset,
    ImageTextPairs,
    ZeroShotEvalDataset,
    digit_caption,
)
from solo.data.registry import (
    DATASETS,
    DataConfig,
    build_dataset,
    build_split,
    dataset_stats,
    register_dataset,
)
from solo.data.multiview import EvalDataset, MultiViewDataset
from solo.data.shards import ShardDataset, ShardPairs, expand_shards
from solo.data.seeding import sample_seed, seeded_rng
from solo.data.transforms import (
    ViewAugmentation,
    as_view_augmentation,
    build_eval_transform,
    build_view_transform,
    build_view_transforms,
    expand_views,
    view_sizes,
)

__all__ = [
    "DATASETS",
    "DataConfig",
    "CIFAR10Dataset",
    "CIFAR100Dataset",
    "DigitsDataset",
    "ImageFolderDataset",
    "ImageReadError",
    "SyntheticDataset",
    "build_dataset",
    "build_split",
    "dataset_stats",
    "register_dataset",
    "DIGIT_TEMPLATES",
    "CsvPairs",
    "DigitsPairs",
    "ImageTextDataset",
    "ImageTextPairs",
    "ZeroShotEvalDataset",
    "digit_caption",
    "EvalDataset",
    "MultiViewDataset",
    "ShardDataset",
    "ShardPairs",
    "expand_shards",
    "sample_seed",
    "seeded_rng",
    "ViewAugmentation",
    "as_view_augmentation",
    "build_eval_transform",
    "build_view_transform",
    "build_view_transforms",
    "expand_views",
    "view_sizes",
]
