"""The checkpoint zoo: every published entry loads, verifies and reproduces its manifest numbers; tampered
or mismatched files are refused; exports load in timm and torchvision with identical outputs."""

import json
import shutil
import subprocess
import sys

import pytest
import timm
import torch
import torchvision

import solo.zoo
from solo.backbones import create_backbone
from solo.data import DigitsDataset
from solo.distributed.checkpoint import read_checkpoint
from solo.downstream.offline import evaluate_pretrained
from solo.train.trainer import pretrain
from solo.zoo import ChecksumError, ManifestError, export_backbone, read_training_checkpoint
from solo.zoo.manifest import MANIFEST, read_manifest
from solo.zoo.weights import load_strict, sha256_file
from tests.test_eval import compose_linear
from tests.test_train import REPO, TINY, compose_cfg

TOLERANCE = json.loads(MANIFEST.read_text())["tolerance"]


@pytest.mark.slow
@pytest.mark.one_process
def test_every_entry_loads_verified_and_runs():
    names = solo.zoo.list()
    assert {e["method"] for e in map(solo.zoo.entry, names)} >= {"simclr", "barlow_twins", "clip"}
    digits = torch.utils.data.Subset(DigitsDataset("val", 16), range(4))
    for name in names:
        entry = solo.zoo.entry(name)
        path = REPO / entry["file"]["location"]
        assert path.stat().st_size == entry["file"]["size"] and sha256_file(path) == entry["file"]["sha256"]
        module = solo.zoo.load(name)
        assert not module.training
        images = torch.stack([solo.zoo.eval_transform(name)(image) for image, _ in digits])
        with torch.no_grad():
            if entry["contents"] == "model":
                features, embedding = module.image_features(images), module.encode_image(images)
                assert embedding.norm(dim=1).allclose(torch.ones(4), atol=1e-5)
                assert hasattr(module, "encode_text")
            else:
                features = module(images)
        assert features.shape[0] == 4 and torch.isfinite(features).all()


# One entry of each kind that main_linear.py evaluates differently: a ResNet backbone (with the random-init baseline), an
# image-text model (zero-shot too), a ViT on 4 px patches, and one trained with a teacher. `python scripts/build_zoo.py
# --reevaluate` runs the same check on every entry (about 8 s each); the quick suite loads and runs every entry.
REEVALUATED = [
    "simclr-digits-resnet18half",
    "clip-digits-resnet18half",
    "mae-digits-vittiny6",
    "distill-digits-resnet18half",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", REEVALUATED)
@pytest.mark.one_process
def test_main_linear_reproduces_the_manifest(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SOLO_CACHE", str(tmp_path / "cache"))
    entry = solo.zoo.entry(name)
    summary = evaluate_pretrained(compose_linear([f"pretrained={name}", "plots=false"]), tmp_path / "eval")
    for kind, published in entry["results"].items():
        assert summary[kind]["protocol"] == published["protocol"]
        assert abs(summary[kind]["acc1"] - published["acc1"]) <= TOLERANCE["reevaluate"], (
            kind,
            summary[kind],
            published,
        )
    if entry["method"] == "simclr":  # the random-init baseline is far lower (one architecture for all entries)
        baseline = evaluate_pretrained(
            compose_linear([f"pretrained={name}", "random_init=true", "plots=false"]), tmp_path / "b"
        )
        assert baseline["linear"]["acc1"] < entry["results"]["linear"]["acc1"] - 0.1
        assert baseline["knn"]["acc1"] < entry["results"]["knn"]["acc1"] - 0.2


@pytest.fixture
def private_zoo(tmp_path, monkeypatch):
    """A copy of the manifest and one weights file, in a repository-like tmp dir."""
    entry = read_manifest()[0]
    (tmp_path / "zoo" / "weights").mkdir(parents=True)
    shutil.copy(REPO / entry["file"]["location"], tmp_path / entry["file"]["location"])
    manifest = tmp_path / "zoo" / "manifest.json"
    manifest.write_text(json.dumps({"tolerance": TOLERANCE, "entries": [entry]}))
    monkeypatch.setenv("SOLO_ZOO_MANIFEST", str(manifest))
    monkeypatch.setenv("SOLO_CACHE", str(tmp_path / "cache"))
    return tmp_path, entry


def test_a_tampered_file_is_refused(private_zoo):
    root, entry = private_zoo
    path = root / entry["file"]["location"]
    solo.zoo.load(entry["name"])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight: same size, still valid safetensors
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=f"refusing to load zoo entry '{entry['name']}'.*sha256"):
        solo.zoo.load(entry["name"])
    path.write_bytes(bytes(data[:-4]))
    with pytest.raises(ChecksumError, match="size"):
        solo.zoo.load(entry["name"])


def test_url_entries_download_once_then_work_offline(private_zoo):
    root, entry = private_zoo
    served = root / "server" / "weights.safetensors"
    served.parent.mkdir()
    shutil.move(root / entry["file"]["location"], served)
    entry["file"]["location"] = served.as_uri()
    (root / "zoo" / "manifest.json").write_text(json.dumps({"tolerance": TOLERANCE, "entries": [entry]}))

    with pytest.raises(FileNotFoundError, match="not in the cache"):
        solo.zoo.load(entry["name"], offline=True)
    solo.zoo.load(entry["name"])  # downloads into $SOLO_CACHE/zoo/<sha256>/
    cached = root / "cache" / "zoo" / entry["file"]["sha256"] / "weights.safetensors"
    assert sha256_file(cached) == entry["file"]["sha256"]
    served.unlink()  # the "server" is gone: the cache still serves, offline or not
    solo.zoo.load(entry["name"], offline=True)
    solo.zoo.load(entry["name"])

    cached.write_bytes(cached.read_bytes()[:-1] + b"\0")
    with pytest.raises(ChecksumError):
        solo.zoo.load(entry["name"], offline=True)


def test_a_bad_download_leaves_nothing_in_the_cache(private_zoo):
    root, entry = private_zoo
    served = root / "served.safetensors"
    served.write_bytes(b"\0" * entry["file"]["size"])
    entry["file"]["location"] = served.as_uri()
    (root / "zoo" / "manifest.json").write_text(json.dumps({"tolerance": TOLERANCE, "entries": [entry]}))
    with pytest.raises(ChecksumError):
        solo.zoo.load(entry["name"])
    assert not any(p.is_file() for p in (root / "cache").rglob("*"))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda e: e.pop("command"), "lacks 'command'"),
        (lambda e: e["file"].update(sha256="abc"), "64 lowercase hex"),
        (lambda e: e["results"].pop("knn"), "lacks results.knn"),
        (lambda e: e.update(epochs="10"), "'epochs' must be int"),
        (lambda e: e["results"]["linear"].update(acc1=1.5), r"not in \[0, 1\]"),
    ],
)
def test_manifest_schema_errors_name_the_field(private_zoo, edit, message):
    root, entry = private_zoo
    edit(entry)
    (root / "zoo" / "manifest.json").write_text(json.dumps({"tolerance": TOLERANCE, "entries": [entry]}))
    with pytest.raises(ManifestError, match=message):
        solo.zoo.list()


def test_unknown_zoo_name_lists_the_zoo():
    with pytest.raises(FileNotFoundError, match="neither a zoo name"):
        solo.zoo.resolve("simclr-imagenet-nonexistent")
    with pytest.raises(KeyError, match="the zoo has: " + solo.zoo.list()[0]):
        solo.zoo.entry("nope")


@pytest.fixture(scope="module")
def stock_checkpoints(tmp_path_factory):
    """Short real runs with stock stems (exportable): a timm and a torchvision ResNet-18."""
    runs = {}
    for name in ("resnet18", "torchvision.resnet18"):
        run_dir = tmp_path_factory.mktemp(name.replace(".", "_"))
        pretrain(
            compose_cfg(
                TINY
                + ["data.batch_size=8", "trainer.max_steps=2", f"backbone.name={name}", "backbone.small_stem=false"]
            ),
            run_dir,
        )
        runs[name] = run_dir / "checkpoints" / "last"
    return runs


def test_strict_loader_reads_the_backbone_by_explicit_keys(stock_checkpoints, tmp_path):
    checkpoint = stock_checkpoints["resnet18"]
    state = read_checkpoint(checkpoint)
    pretrained = read_training_checkpoint(checkpoint)
    backbone = pretrained.build_backbone()
    for key, value in backbone.state_dict().items():
        assert torch.equal(value, state["model"]["method.backbone." + key])

    state["model"].pop("method.backbone.layer1.0.conv1.weight")
    state["model"]["method.backbone.extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "broken.pt")
    with pytest.raises(
        KeyError, match=r"1 missing key\(s\): layer1.0.conv1.weight; 1 unexpected key\(s\): extra.weight"
    ):
        read_training_checkpoint(tmp_path / "broken.pt").build_backbone()
    with pytest.raises(KeyError, match=r"wrong shape.*conv1.weight: file \(64, 3, 7, 7\), model \(64, 3, 3, 3\)"):
        load_strict(create_backbone("resnet18", small_stem=True)[0], pretrained.backbone_state(), "test")
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="not a solo training checkpoint"):
        read_training_checkpoint(tmp_path / "plain.pt")


@pytest.mark.slow  # exports and loads in timm and torchvision: about 9 s
@pytest.mark.one_process
def test_export_loads_in_timm_and_torchvision_with_identical_outputs(stock_checkpoints, tmp_path):
    images = torch.randn(2, 3, 32, 32)
    ours = read_training_checkpoint(stock_checkpoints["resnet18"]).build_backbone().eval()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "solo.zoo",
            "export",
            str(stock_checkpoints["resnet18"]),
            str(tmp_path / "timm.safetensors"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "timm.create_model('resnet18', pretrained=True, num_classes=0, pretrained_cfg_overlay" in out.stdout
    model = timm.create_model(
        "resnet18",
        pretrained=True,
        num_classes=0,
        pretrained_cfg_overlay=dict(file=str(tmp_path / "timm.safetensors"), num_classes=0),
    ).eval()
    with torch.no_grad():
        assert torch.equal(model(images), ours(images))

    ours = read_training_checkpoint(stock_checkpoints["torchvision.resnet18"]).build_backbone().eval()
    export_backbone(stock_checkpoints["torchvision.resnet18"], tmp_path / "tv.pth")
    model = torchvision.models.resnet18()
    model.fc = torch.nn.Identity()
    model.load_state_dict(torch.load(tmp_path / "tv.pth", weights_only=True))
    with torch.no_grad():
        assert torch.equal(model.eval()(images), ours(images))


@pytest.mark.slow
@pytest.mark.one_process
def test_list_command_prints_every_entry_with_its_results():
    out = subprocess.run([sys.executable, "-m", "solo.zoo", "list"], capture_output=True, text=True, check=True).stdout
    for name in solo.zoo.list():
        linear = solo.zoo.entry(name)["results"]["linear"]["acc1"]
        assert any(line.startswith(name) and f"linear {linear:.3f}" in line for line in out.splitlines())


@pytest.mark.slow
@pytest.mark.one_process
def test_export_refuses_the_small_stem(tmp_path):
    with pytest.raises(ValueError, match="small_stem=true"):
        export_backbone(solo.zoo.list()[0], tmp_path / "never-written.safetensors")
    # LiT's image backbone is its locked tower, the teacher's weights unchanged, and its text tower is solo's (not
    # open_clip's): the command points at the tower's source in one line, exit status 2, and writes nothing.
    out = subprocess.run(
        [sys.executable, "-m", "solo.zoo", "export", "lit-digits-resnet18half", str(tmp_path / "lit.pth")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(
        "error: lit-digits-resnet18half: a lit model's image backbone is its locked method.teacher="
        "clip-digits-resnet18half, saved unchanged; export or load that source instead"
    )
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "lit.pth").exists()
