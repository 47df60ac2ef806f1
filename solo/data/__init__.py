"""Data pipeline: base datasets, augmentations and per-sample seeded multi-view wrappers."""

from solo.data.datasets import (
    ANY_SIZE_DATASETS,
    DATASET_STATS,
    DATASETS,
    CIFAR10Dataset,
    CIFAR100Dataset,
    DigitsDataset,
    ImageFolderDataset,
    ImageReadError,
    SyntheticDataset,
    build_dataset,
    dataset_stats,
)
from solo.data.image_text import (
    DIGIT_TEMPLATES,
    IMAGE_TEXT_DATASETS,
    CsvPairs,
    DigitsPairs,
    ImageTextDataset,
    ImageTextPairs,
    ZeroShotEvalDataset,
    build_image_text_pairs,
    build_split,
    digit_caption,
)
from solo.data.multiview import EvalDataset, MultiViewDataset
from solo.data.seeding import sample_seed, seeded_rng
from solo.data.transforms import (
    ViewAugmentation,
    as_view_augmentation,
    build_eval_transform,
    build_view_transform,
)

__all__ = [
    "ANY_SIZE_DATASETS",
    "DATASET_STATS",
    "DATASETS",
    "CIFAR10Dataset",
    "CIFAR100Dataset",
    "DigitsDataset",
    "ImageFolderDataset",
    "ImageReadError",
    "SyntheticDataset",
    "build_dataset",
    "dataset_stats",
    "DIGIT_TEMPLATES",
    "IMAGE_TEXT_DATASETS",
    "CsvPairs",
    "DigitsPairs",
    "ImageTextDataset",
    "ImageTextPairs",
    "ZeroShotEvalDataset",
    "build_image_text_pairs",
    "build_split",
    "digit_caption",
    "EvalDataset",
    "MultiViewDataset",
    "sample_seed",
    "seeded_rng",
    "ViewAugmentation",
    "as_view_augmentation",
    "build_eval_transform",
    "build_view_transform",
]
