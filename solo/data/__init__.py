"""Data pipeline, in four parts that import only downwards (.importlinter): views (what the model sees), sources
(where samples come from: the registry of datasets), sampling (which samples each rank reads) and decode (reading
images). The names below are the public ones."""

from solo.data.decode import ImageReadError
from solo.data.sampling.seeding import sample_seed, seeded_rng
from solo.data.sampling.source import eval_loader, real_rows
from solo.data.sources.huggingface import HuggingFaceImages, HuggingFacePairs
from solo.data.sources.images import (
    CIFAR10Dataset,
    CIFAR100Dataset,
    DigitsDataset,
    ImageFolderDataset,
    SyntheticDataset,
)
from solo.data.sources.pairs import DIGIT_TEMPLATES, CsvPairs, DigitsPairs, ImageTextPairs, digit_caption
from solo.data.sources.registry import (
    DATASETS,
    DataConfig,
    DownloadConfig,
    FolderConfig,
    build_dataset,
    build_split,
    data_id,
    data_locations,
    dataset_stats,
    register_dataset,
)
from solo.data.sources.shards import ShardDataset, ShardPairs, expand_shards
from solo.data.views.image_text import ImageTextDataset, ZeroShotEvalDataset
from solo.data.views.multiview import EvalDataset, MultiViewDataset
from solo.data.views.transforms import (
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
    "data_id",
    "data_locations",
    "DownloadConfig",
    "FolderConfig",
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
    "eval_loader",
    "real_rows",
    "EvalDataset",
    "MultiViewDataset",
    "HuggingFaceImages",
    "HuggingFacePairs",
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
