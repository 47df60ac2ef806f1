"""CLIP and SigLIP with open_clip's towers (method.model): trained in solo, exported to open_clip and back with the
same embeddings, open_clip's BPE tokenizer, clear errors; ImageNet's zero-shot class names and CLIP's templates.
Real open_clip models, scaled down to run in seconds on a CPU."""

import math
import sys

import open_clip
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import solo.zoo
from solo.data import ImageFolderDataset
from solo.downstream.offline import evaluate_pretrained
from solo.errors import ConfigError, NotFound
from solo.eval.zero_shot import class_names, class_prompts, imagenet_zeroshot
from solo.train.trainer import build_model, pretrain
from solo.zoo.__main__ import main as zoo_command
from tests.test_eval import compose_linear
from tests.test_train import compose_cfg, metrics

NAME = "ViT-B-32"
# ViT-B-32's open_clip config scaled down to 16 px digits; complete entries, so open_clip builds the same from them.
MODEL_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 16, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
TINY = [
    f"method.model={NAME}",
    f"+method.model_cfg={MODEL_CFG}".replace("'", ""),
    "data.num_workers=0",
    "trainer.progress_bar=false",
    "trainer.plots=false",
]
INIT_LOGIT_SCALE = {"clip": 1 / 0.07, "siglip": 10.0}
CAPTIONS = ["a handwritten 7.", "the digit two.", "a photo of a dog, on grass!", ""]


def build(overrides, method="clip"):
    """The method as the trainer builds it."""
    torch.manual_seed(0)
    return build_model(compose_cfg([f"method={method}"] + TINY + overrides), None).method.eval()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A few real training steps of CLIP and SigLIP with open_clip towers on the digits."""
    out = {}
    for method in ("clip", "siglip"):
        run_dir = tmp_path_factory.mktemp(method)
        pretrain(compose_cfg([f"method={method}"] + TINY + ["data.batch_size=32", "trainer.max_steps=3"]), run_dir)
        out[method] = run_dir
    return out


@pytest.mark.parametrize("method", ["clip", "siglip"])
def test_trained_model_exports_to_open_clip_with_the_same_embeddings(runs, method, tmp_path):
    ours = solo.zoo.load(str(runs[method]))
    assert ours.log_logit_scale.item() != pytest.approx(math.log(INIT_LOGIT_SCALE[method]))  # trained
    call = solo.zoo.export_open_clip(runs[method], tmp_path / "model.bin")
    assert call.startswith(
        f"model, _, preprocess = open_clip.create_model_and_transforms('{NAME}', pretrained='{tmp_path / 'model.bin'}'"
    )
    assert call.endswith(f"tokenizer = open_clip.get_tokenizer('{NAME}', context_length=32)")
    assert f"image_mean={tuple(solo.zoo.resolve(str(runs[method])).data['mean'])}" in call
    extra = {"init_logit_bias": ours.bias.item()} if method == "siglip" else {}  # open_clip's ViT-B-32 has no bias
    model, _, _ = open_clip.create_model_and_transforms(
        NAME, pretrained=str(tmp_path / "model.bin"), **MODEL_CFG, **extra
    )
    model.eval()
    images, tokens = torch.randn(4, 3, 16, 16), ours.tokenizer(CAPTIONS)
    with torch.no_grad():
        assert (model.encode_image(images, normalize=True) - ours.encode_image(images)).abs().max() <= 1e-6
        assert (model.encode_text(tokens, normalize=True) - ours.encode_text(tokens)).abs().max() <= 1e-6
    scale = ours.logit_scale() if method == "clip" else ours.log_logit_scale.exp()
    assert model.logit_scale.exp().item() == pytest.approx(scale.item(), rel=1e-6)
    if method == "siglip":
        assert model.logit_bias.item() == pytest.approx(ours.bias.item(), rel=1e-6)


def test_export_command_writes_open_clip_weights(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["solo.zoo", "export", str(runs["clip"]), str(tmp_path / "clip.safetensors")])
    zoo_command()
    assert "open_clip.create_model_and_transforms" in capsys.readouterr().out
    open_clip.create_model(NAME, pretrained=str(tmp_path / "clip.safetensors"), **MODEL_CFG)


@pytest.mark.parametrize("suffix", [".bin", ".safetensors"])
def test_weights_saved_by_open_clip_load_through_method_pretrained(tmp_path, suffix):
    torch.manual_seed(1)
    model = open_clip.create_model(NAME, **MODEL_CFG).eval()
    with torch.no_grad():
        model.logit_scale.fill_(3.5)
    path = tmp_path / f"open_clip{suffix}"
    if suffix == ".bin":
        torch.save(model.state_dict(), path)
    else:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    ours = build([f"method.pretrained={path}"])
    images, tokens = torch.randn(4, 3, 16, 16), open_clip.get_tokenizer(NAME, context_length=32)(CAPTIONS)
    with torch.no_grad():
        assert (model.encode_image(images, normalize=True) - ours.encode_image(images)).abs().max() <= 1e-6
        assert (model.encode_text(tokens, normalize=True) - ours.encode_text(tokens)).abs().max() <= 1e-6
        # What the online probe and k-NN read: open_clip's image embedding before normalisation.
        assert (model.encode_image(images) - ours.image_features(images)).abs().max() <= 1e-6
    assert ours.log_logit_scale.item() == 3.5 and ours.feature_dim == MODEL_CFG["embed_dim"]


def test_tokenizer_is_open_clips_bpe():
    ours = build(["method.model_cfg.text_cfg.context_length=77"]).tokenizer  # ViT-B-32's own context
    reference = open_clip.get_tokenizer(NAME)
    assert torch.equal(ours(CAPTIONS), reference(CAPTIONS))
    assert ours.vocab_size == 49408 and ours.context_length == 77
    long = "a photo of " + "many " * 80 + "digits."
    tokens, truncated = ours.encode(long)
    assert truncated and not ours.encode(CAPTIONS[2])[1] and torch.equal(tokens, reference([long])[0])
    short = build([]).tokenizer  # the context follows the model's config
    assert torch.equal(short(CAPTIONS), open_clip.get_tokenizer(NAME, context_length=32)(CAPTIONS))


def test_default_clip_keeps_solos_own_towers():
    method = build_model(compose_cfg(["method=clip", "backbone.name=test_resnet"]), None).method
    assert type(method.tokenizer).__name__ == "ByteTokenizer" and type(method.text_tower).__name__ == "TextTransformer"


def test_configuration_errors_name_the_key():
    with pytest.raises(
        ConfigError,
        match=r"method.model=ViT-B-3 is not an open_clip model; did you mean: ViT-B-32.*open_clip.list_models\(\)",
    ):
        compose_cfg(["method=clip", "method.model=ViT-B-3"])
    with pytest.raises(ConfigError, match=r"method.model=ViT-B-32 takes 224 px images .*data.image_size=16"):
        compose_cfg(["method=clip", "method.model=ViT-B-32"])
    with pytest.raises(
        NotFound, match=r"method.pretrained=/nowhere/model.bin: no such file, nor one of open_clip's tags"
    ):
        compose_cfg(["method=clip"] + TINY + ["method.pretrained=/nowhere/model.bin"])


def test_weights_of_another_model_are_refused(tmp_path):
    other = open_clip.create_model(NAME, **{**MODEL_CFG, "embed_dim": 16})
    torch.save(other.state_dict(), tmp_path / "other.bin")
    with pytest.raises(
        ConfigError,
        match=r"(?s)method.pretrained=.*other.bin: open_clip cannot load it into method.model=ViT-B-32.*size mismatch",
    ):
        build([f"method.pretrained={tmp_path / 'other.bin'}"])


def test_solo_towers_are_not_exported_to_open_clip(tmp_path):
    with pytest.raises(ValueError, match="without open_clip towers"):
        solo.zoo.export_open_clip("clip-digits-resnet18half", tmp_path / "model.bin")


def test_imagenet_zero_shot_names_and_templates():
    data = imagenet_zeroshot()
    assert len(data["classnames"]) == 1000 and data["classnames"] == list(open_clip.IMAGENET_CLASSNAMES)
    assert len(data["wnids"]) == len(set(data["wnids"])) == 1000 and data["wnids"] == sorted(data["wnids"])
    assert data["templates"] == [t("{}") for t in open_clip.OPENAI_IMAGENET_TEMPLATES]
    assert class_names(["n01440764", "n02123045", "n15075141", "golden_retriever"]) == [
        "tench",
        "tabby cat",
        "toilet paper",
        "golden retriever",
    ]


@pytest.fixture
def synset_folder(tmp_path):
    """A tiny ImageNet-style folder: synset-named class folders, and one plain name."""
    for split in ("train", "val"):
        for c, folder in enumerate(("n01440764", "n02123045", "golden_retriever")):
            (tmp_path / split / folder).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (20, 20), (80 * c, 40 * i, 0)).save(tmp_path / split / folder / f"{i}.png")
    return tmp_path


def test_an_imagefolder_of_synsets_gets_imagenet_prompts(synset_folder, runs, monkeypatch):
    classes = ImageFolderDataset(str(synset_folder), "train").classes
    prompts = class_prompts("imagefolder", classes)
    assert classes == ["golden_retriever", "n01440764", "n02123045"]  # sorted folder names
    assert [p[0] for p in prompts] == [
        "a bad photo of a golden retriever.",
        "a bad photo of a tench.",
        "a bad photo of a tabby cat.",
    ]
    assert all(len(p) == 80 for p in prompts)
    monkeypatch.setenv("SOLO_CACHE", str(synset_folder / "cache"))
    summary = evaluate_pretrained(
        compose_linear(
            [
                f"pretrained={runs['clip']}",
                "data=imagefolder",
                f"data.root={synset_folder}",
                "data.image_size=16",
                "linear.epochs=2",
                "plots=false",
            ]
        ),
        synset_folder / "eval",
    )
    assert summary["zero_shot"]["protocol"].startswith("zero-shot with 80 prompt(s) per class")
    with pytest.raises(ConfigError, match=r"data.image_size=32: .* for 16 px images"):
        evaluate_pretrained(
            compose_linear([f"pretrained={runs['clip']}", "data.image_size=32"]), synset_folder / "eval32"
        )


def test_training_classifies_an_imagefolder_zero_shot_as_main_linear_does(synset_folder, tmp_path, monkeypatch):
    """trainer.zero_shot_folder: at each epoch end, the same zero-shot accuracy as main_linear.py data=imagefolder on
    those images (its own path: cached features, then the classifier)."""
    run_dir = tmp_path / "run"
    pretrain(
        compose_cfg(
            ["method=clip"]
            + TINY
            + ["data.batch_size=32", "trainer.max_steps=2", f"trainer.zero_shot_folder={synset_folder / 'val'}"]
        ),
        run_dir,
    )
    logged = [m for m in metrics(run_dir) if "val/folder_zeroshot_acc1" in m][-1]
    monkeypatch.setenv("SOLO_CACHE", str(tmp_path / "cache"))
    summary = evaluate_pretrained(
        compose_linear(
            [
                f"pretrained={run_dir}",
                "data=imagefolder",
                f"data.root={synset_folder}",
                "data.image_size=16",
                "linear.epochs=1",
                "plots=false",
            ]
        ),
        tmp_path / "eval",
    )
    assert logged["val/folder_zeroshot_acc1"] == pytest.approx(summary["zero_shot"]["acc1"], abs=1e-12)
    assert logged["val/folder_zeroshot_acc5"] == pytest.approx(summary["zero_shot"]["acc5"], abs=1e-12)
    with pytest.raises(ConfigError, match=r"trainer.zero_shot_folder=.*needs an image-text method"):
        pretrain(
            compose_cfg(
                [
                    "method=simclr",
                    "data.num_workers=0",
                    "trainer.max_steps=1",
                    f"trainer.zero_shot_folder={synset_folder / 'val'}",
                ]
            ),
            tmp_path / "simclr",
        )
