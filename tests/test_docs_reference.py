"""What docs/hooks.py generates when the site is built: the configuration reference names every key of every
registered kind and of the trainer's schemas, getting-started's group tables every option, so neither can fall behind
the code; numbers quoted from the zoo are the manifest's; and the site loads nothing from the network."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import solo.config as sc
from tests.test_train import REPO


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(schema, prefix: str):
    """Every dotted key of a schema dataclass, nested dataclasses flattened."""
    for f in dataclasses.fields(schema):
        nested = f.type if dataclasses.is_dataclass(f.type) else None
        if nested is None and f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            nested = type(value) if dataclasses.is_dataclass(value) else None
        yield from _keys(nested, f"{prefix}{f.name}.") if nested else [f"{prefix}{f.name}"]


def test_the_configuration_reference_lists_every_key():
    """Each registered entry's section (anchor `<group>-<name>`) and the trainer's list every key of its schema."""
    reference = _hooks().config_reference()
    sections = dict(re.findall(r"\{#([\w-]+)\}\n(.*?)(?=\n#|\Z)", reference, re.S))
    wanted = {"trainer": {f"trainer.{k}" for k in _keys(sc.TrainerConfig, "")}}
    for group, registry in sc.registered_groups().items():
        for entry in registry:
            if entry.schema is not None:
                wanted[f"{group}-{entry.name}"] = {f"{group}.{k}" for k in _keys(entry.schema, "")}
    assert len(wanted) > 30 and sum(map(len, wanted.values())) > 250
    for anchor, keys in wanted.items():
        listed = set(re.findall(r"^\| `([\w.]+)` \|", sections.get(anchor, ""), re.M))
        assert keys <= listed, f"{anchor}: the reference does not list {sorted(keys - listed)}"


def test_the_getting_started_groups_list_every_option():
    """getting-started's group tables (`<!-- config-groups -->`) have a row for every registered name of every
    registry group (every method, dataset, optimizer, logger) and for every YAML option of every folder under
    solo/configs/ (every backbone, augmentation, experiment, ...), each with a description."""
    import solo.configs

    groups = _hooks().config_groups()
    sections = dict(re.findall(r"\{#group-(\w+)\}\n(.*?)(?=\n### |\Z)", groups, re.S))
    rows = {
        g: dict(re.findall(r"^\| `(?:\w+\.name=)?([\w.-]+)` \| (.*) \|$", text, re.M)) for g, text in sections.items()
    }
    wanted = {group: set(registry.names()) for group, registry in sc.registered_groups().items()}
    for folder in Path(solo.configs.__file__).parent.iterdir():
        if folder.is_dir() and folder.name != "hydra" and any(folder.glob("*.yaml")):
            wanted.setdefault(folder.name, set()).update(p.stem for p in folder.glob("*.yaml"))
    assert {"method", "backbone", "data", "augmentation", "optim", "logger"} <= set(wanted)
    assert {"mae", "dinov2", "ijepa"} <= wanted["method"] and {"vit_tiny", "vit_tiny_6"} <= wanted["backbone"]
    for group, options in wanted.items():
        listed = rows.get(group, {})
        assert options <= set(listed), f"`{group}`: getting-started does not list {sorted(options - set(listed))}"
        for option in options:
            assert len(listed[option]) > 10, f"`{group}={option}`: no description ({listed[option]!r})"
    page = (REPO / "docs" / "getting-started.md").read_text()
    assert "<!-- config-groups -->" in page and "| group | options |" not in page  # generated, not hand-written


def test_zoo_results_quoted_in_the_docs_are_the_manifests():
    """`<!-- zoo-result: ENTRY KINDS -->` gives the manifest's numbers as the zoo table rounds them; an unknown entry
    or result is an error, not a blank; the methods page's digits table takes every entry's numbers from it."""
    import pytest

    from solo.zoo.manifest import read_manifest

    hooks = _hooks()
    clip = next(e for e in read_manifest() if e["name"] == "clip-digits-resnet18half")
    expected = " / ".join(f"{clip['results'][k]['acc1']:.3f}" for k in ("linear", "knn", "zero_shot"))
    assert hooks.zoo_result("clip-digits-resnet18half", "linear/knn/zero_shot") == expected
    for name, kinds in (("no-such-entry", "linear"), ("simclr-digits-resnet18half", "zero_shot")):
        with pytest.raises(ValueError, match="zoo-result"):
            hooks.zoo_result(name, kinds)
    methods = (REPO / "docs" / "methods" / "index.md").read_text()  # its digits table quotes every entry
    for entry in read_manifest():
        assert f"<!-- zoo-result: {entry['name']} linear/knn -->" in methods, (
            f"{entry['name']}: not in methods/index.md"
        )


def test_the_site_makes_no_network_request(tmp_path):
    """A page built with the site's own mkdocs.yml (theme, hooks, extra JavaScript and CSS) loads no script or style
    sheet from http(s): MathJax comes from the `docs` extra's files, copied into the site, and the theme uses the
    system's fonts. No page's Markdown brings in one of its own either. (One page, not the whole site: the tags at
    stake come from mkdocs.yml and the theme, the same on every page; CI builds the whole site.)"""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    remote = re.compile(r"<(script|link)\b[^>]*\b(src|href)\s*=\s*[\"']?(https?:)?//", re.I)
    for page in (REPO / "docs").rglob("*.md"):
        assert not remote.search(page.read_text()), f"{page}: a remote script or style sheet"
    docs = tmp_path / "docs"
    (docs / "javascripts").mkdir(parents=True)
    (docs / "javascripts" / "mathjax.js").write_text((REPO / "docs" / "javascripts" / "mathjax.js").read_text())
    (docs / "index.md").write_text("# Math\n\n$$\\mathcal{L} = -\\log p$$ and $x^2$\n")
    config = load_config(
        str(REPO / "mkdocs.yml"), docs_dir=str(docs), site_dir=str(tmp_path / "site"), nav=["index.md"], strict=False
    )
    build(config)
    html = (tmp_path / "site" / "index.html").read_text()
    assert 'class="arithmatex"' in html
    assert not remote.search(html), remote.search(html).group(0)
    scripts = re.findall(r"<script\b[^>]*\bsrc=\"([^\"]+)\"", html)
    mathjax = [s for s in scripts if s.endswith("tex-mml-chtml.js")]
    assert mathjax and (tmp_path / "site" / mathjax[0]).is_file(), scripts
    fonts = tmp_path / "site" / Path(mathjax[0]).parent / "output" / "chtml" / "fonts" / "woff-v2"
    assert any(fonts.glob("*.woff")), "MathJax's CommonHTML fonts are not in the site"
