"""The documentation's configuration reference (docs/hooks.py, generated when the site is built) names every key of
every registered kind and of the trainer's schemas, so it cannot fall behind the code."""

import dataclasses
import importlib.util
import re

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
