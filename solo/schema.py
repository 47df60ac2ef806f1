"""Value rules for config schemas: `lr: float = ruled(0.3, POSITIVE)`, checked by `check_values` when a
config is validated, with errors that name the key and the value typed (`optim.lr=-1: must be > 0`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

from solo.errors import ConfigError


class Choice(str, Enum):
    """A fixed set of strings; YAML and the command line give `32` as an int, so values match as strings. A member
    equals its string (`cfg.data.on_bad_image == "skip"`)."""

    @classmethod
    def _missing_(cls, value):
        return cls._value2member_map_.get(str(value))

    def __str__(self) -> str:
        return self.value


def choices(name: str, *values: str) -> type[Choice]:
    return Choice(name, {v: v for v in values})


@dataclass(frozen=True)
class Rule:
    text: str  # what the value must be, e.g. "must be > 0"
    ok: Callable[[Any], bool]


POSITIVE = Rule("must be > 0", lambda v: v > 0)
NON_NEGATIVE = Rule("must be >= 0", lambda v: v >= 0)
AT_LEAST_ONE = Rule("must be >= 1", lambda v: v >= 1)
PROBABILITY = Rule("must be in [0, 1]", lambda v: 0 <= v <= 1)
MOMENTUM = Rule("must be in [0, 1)", lambda v: 0 <= v < 1)
DECAY = Rule("must be in (0, 1]", lambda v: 0 < v <= 1)  # a factor per layer: 1 leaves the rates as they are
FRACTION = Rule("must be in (0, 1)", lambda v: 0 < v < 1)  # e.g. a share of patches to mask: neither none nor all
# A size in px that follows the data unless given (a method's choose_for_the_data resolves auto before anything is built)
AUTO_OR_AT_LEAST_ONE = Rule("must be auto or >= 1", lambda v: v == "auto" or (isinstance(v, int) and v >= 1))
# A loss's tile (solo.losses.tiled): none (the whole logit matrix), auto (from a memory budget), or a count.
TILE = Rule(
    "must be none, auto or a positive number of candidates per tile",
    lambda v: v in ("none", "auto") or (v.isdigit() and int(v) > 0),
)


def ruled(default, rule: Rule):
    """A dataclass field with a default and a rule its value must follow (None always passes: unset)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


# Keys that other trainers (Lightning, accelerate) take to choose devices; solo takes none.
DEVICE_KEYS = ("accelerator", "device", "devices", "gpus", "num_nodes")
DEVICES_HINT = (
    "solo has no device key: it trains on the GPUs when there are any, else on the CPU; one process per GPU with "
    "torchrun --nproc_per_node=<GPUs>, and CUDA_VISIBLE_DEVICES chooses which"
)


def unknown_key_hint(key: str) -> str:
    """What to say after `key` is found unknown, where solo knows what was meant ("" elsewhere)."""
    return f"; {DEVICES_HINT}" if key.rpartition(".")[2] in DEVICE_KEYS else ""


def check_values(node: DictConfig, key: str = "") -> None:
    """Check the structured config `node` recursively (lists of them too): no key its schema lacks, every ruled
    field's value, and a schema's `validate()` method if it has one (its ValueError names fields as `field=value`,
    each prefixed with the node's key here). Unset (???) values are skipped.
    Raises ConfigError naming the key."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    known = [f.name for f in dataclasses.fields(schema)]
    unknown = [k for k in node.keys() if k not in known]
    if unknown:  # added with `+`: Hydra opens the node for them, the schema still does not know them
        full = f"{key}.{unknown[0]}" if key else unknown[0]
        raise ConfigError(
            f"Key '{unknown[0]}' not in '{schema.__name__}' (full key {full}); its keys: {', '.join(known)}"
            + unknown_key_hint(full)
        )
    if hasattr(schema, "validate") and not OmegaConf.missing_keys(node):
        try:
            OmegaConf.to_object(node).validate()
        except ValueError as e:  # every field it names as `field=value` gets the node's key: the full key
            fields = "|".join(map(re.escape, known))
            raise ConfigError(re.sub(rf"(?<![.\w])({fields})=", rf"{key}.\1=", str(e)) if key else str(e)) from None
    for f in dataclasses.fields(schema):
        name = f"{key}.{f.name}" if key else f.name
        if OmegaConf.is_missing(node, f.name):
            continue
        value, rule = node[f.name], f.metadata.get("rule")
        if rule is not None and value is not None and not rule.ok(value):
            raise ConfigError(f"{name}={value}: {rule.text}")
        if isinstance(value, DictConfig):
            check_values(value, name)
        elif isinstance(value, ListConfig):
            for i, item in enumerate(value):
                if isinstance(item, DictConfig):
                    check_values(item, f"{name}[{i}]")
