from setuptools import find_packages, setup

setup(
    name="solo",
    version="0.1.0",
    description="Self-supervised visual and image-text pretraining with world-size invariant distributed losses",
    packages=find_packages(include=["solo", "solo.*"]),
    package_data={"solo.eval": ["data/*.json"]},  # ImageNet class names and CLIP's prompt templates
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.2",
        "torchvision>=0.17",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "timm>=0.9",
        "wandb>=0.16",
        "scikit-learn>=1.2",
        "numpy>=1.24",
        "pillow>=9.0",
        "tqdm>=4.60",
        "safetensors>=0.4",
        "matplotlib>=3.7",
        "webdataset>=0.2.90",  # tar shards: brace patterns, URL opening, ShardWriter (solo.data.shards)
        "open_clip_torch>=2.24",  # CLIP towers by name, BPE tokenizer, weights to and from open_clip
    ],
    extras_require={
        "huggingface": ["datasets>=3.0"],  # data=huggingface
        "dev": ["pytest>=7.0", "import-linter>=2.0", "datasets>=3.0"],  # import-linter: the layers in .importlinter
    },
)
