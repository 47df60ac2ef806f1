"""MkDocs hook: replaces markers in the pages with tables generated from solo's code at build time, so they cannot
drift from it.

- `<!-- config-reference -->`: every config key. The trainer's schemas (solo.config: the top level of
  main_pretrain.py and main_linear.py, `trainer`, `augmentation`, `linear`, `knn`, `finetune`) and, for every entry
  of every registry that is a config group (`solo.config.registered_groups()`: method, data, backbone, optim,
  logger), a heading and a table of its keys: type, schema default, the value its YAML option in solo/configs sets,
  the rule or choices recorded on the field (solo.schema), and the comment beside the field in the source.
- `<!-- zoo-table -->`: the checkpoint zoo (zoo/manifest.json) as `solo.zoo.manifest.markdown_table` renders it;
  `<!-- zoo-table: METHOD -->`: the same for that method's entries only.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import typing
from pathlib import Path

import yaml

CONFIG_MARKER = "<!-- config-reference -->"
ZOO_MARKER = re.compile(r"<!-- zoo-table(?::\s*(\w+))?\s*-->")


def on_page_markdown(markdown, page, config, files):
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    return ZOO_MARKER.sub(lambda m: zoo_table(m.group(1)), markdown)


# --- the zoo -----------------------------------------------------------------------------------------------


def zoo_table(method: str | None) -> str:
    from solo.zoo.manifest import markdown_table, read_manifest

    entries = [e for e in read_manifest() if method is None or e["method"] == method]
    return markdown_table(entries) if entries else f"No zoo entry yet for `{method}`."


# --- the configuration reference ---------------------------------------------------------------------------


def config_reference() -> str:
    import solo.config as sc
    import solo.configs

    configs = Path(solo.configs.__file__).parent
    pretrain, linear = (_defaults(configs / f"{name}.yaml") for name in ("pretrain", "linear"))
    sections = {
        "trainer": "trainer",
        "augmentation": "augmentation",
        "linear": "linear-linear",
        "knn": "linear-knn",
        "finetune": "linear-finetune",
    }

    def table(schema, prefix, groups=None, options=None):
        return _table(schema, prefix, groups or {}, sections, options=options, safe=sc.SAFE_TO_CHANGE)

    out = ["## main_pretrain.py", "", "### Top level {#pretrain}", "", *table(sc.PretrainConfig, "", pretrain)]
    out += ["", "### `trainer` {#trainer}", "", *table(sc.TrainerConfig, "trainer.")]
    out += ["", "### `augmentation` {#augmentation}", "", f"Options: {_options(configs / 'augmentation')}.", ""]
    out += table(sc.AugmentationConfig, "augmentation.")
    out += ["", "## main_linear.py", "", "### Top level {#linear}", "", *table(sc.LinearEvalConfig, "", linear)]
    for key in ("linear", "knn", "finetune"):
        schema = typing.get_type_hints(sc.LinearEvalConfig)[key]
        out += ["", f"### `{key}` {{#linear-{key}}}", "", *table(schema, f"{key}.", linear)]
    for group, registry in sc.registered_groups().items():
        out += ["", f"## `{group}` {{#{group}}}", "", f"Registered: `{registry.describe()}`.", ""]
        for entry in [registry[name] for name in registry.names()] + [getattr(registry, "_fallback", None)]:
            if entry is not None:
                out += _entry(group, entry, registry, configs / group, table)
    return "\n".join(out)


def _entry(group: str, entry, registry, folder: Path, table) -> list[str]:
    """A heading for one registry entry and its keys' table, with a column per YAML option that selects it."""
    options = {}
    for path in sorted(folder.glob("*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        if _resolves(registry, values.get("name", path.stem), entry):
            options[path.stem] = values
    registered = entry.name in registry
    title = f"`{entry.name}`" if registered else f"Other names: `{entry.name}`"
    lines = ["", f"### {title} {{#{group}-{entry.name if registered else 'fallback'}}}", ""]
    if group == "method":
        # A method's module docstring, else its class's: a user's module (tests/test_extending.py) may have none.
        doc = inspect.getdoc(inspect.getmodule(entry.target)) or inspect.getdoc(entry.target) or ""
        summary = doc.split("\n\n")[0].replace("\n", " ")
        lines += [f"{summary} See [{entry.name}](../methods/{entry.name}.md).", ""]
    if options:
        listed = ", ".join(f"`{group}={o}`" for o in options)
        lines += [f"Selected by {listed} (`solo/configs/{group}/`); their columns show the values those files set.", ""]
    return lines + table(entry.schema, f"{group}.", options=options)


def _resolves(registry, name: str, entry) -> bool:
    try:
        return registry[name] is entry
    except Exception:
        return False


def _table(schema, prefix: str, groups: dict, sections: dict, *, options=None, safe=()) -> list[str]:
    """A markdown table of the keys of `schema` under `prefix`; `groups`: the option a group field takes by default,
    `sections`: nested schemas documented in a section of their own (their anchor), `options`: YAML values."""
    options = options or {}
    head = ["key", "type", "default", *(f"`{o}.yaml`" for o in options), "rule", "description"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, kind, default, rule, note in _fields(schema, prefix, sections):
        if kind == "any" and key in groups:
            kind, default = "group", f"`{groups[key]}`"
            group = key.rpartition(".")[2]
            note = _then(note if "." in key else "", f"Options: see [`{group}`](#{group}).")
        elif kind == "keys" and key in groups:
            kind, default = "group", f"`{groups[key]}`"
        if key in safe or any(key.startswith(s + ".") for s in safe):
            note = _then(note, "May change on resume.")
        note, rule = (text.replace("<", "&lt;").replace(">", "&gt;") for text in (note, rule))  # prose, not HTML
        cells = [f"`{key}`", kind, default, *(_yaml_value(v, key[len(prefix) :]) for v in options.values()), rule, note]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def _fields(schema, prefix: str, sections: dict):
    """(key, type, default, rule, description) for every field of the dataclass `schema`, nested ones flattened
    unless they have a section of their own."""
    hints = typing.get_type_hints(schema)
    notes = _comments(schema)
    for f in dataclasses.fields(schema):
        hint, key = hints[f.name], prefix + f.name
        is_list = typing.get_origin(hint) is list
        inner = typing.get_args(hint)[0] if is_list else _optional(hint)
        if dataclasses.is_dataclass(inner) and key in sections:
            yield key, "keys", "", "", f"See [`{key}`](#{sections[key]})."
        elif dataclasses.is_dataclass(inner):  # a nested schema (method.text), or a list of them (augmentation.views)
            yield from _fields(inner, key + ("[]." if is_list else "."), sections)
        else:
            rule = f.metadata["rule"].text if "rule" in f.metadata else ""
            if isinstance(inner, type) and issubclass(inner, enum.Enum):
                rule = "one of " + ", ".join(f"`{m.value}`" for m in inner)
            yield key, _type_name(hint), _default(f), rule, notes.get(f.name, "")


def _then(note: str, more: str) -> str:
    return f"{note}{'' if note.endswith('.') else '.'} {more}" if note else more


def _optional(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _type_name(hint) -> str:
    if hint is typing.Any:
        return "any"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "choice"
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(hint) in (list, dict):
        return f"{typing.get_origin(hint).__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint))


def _default(f) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return "required" if value == "???" else f"`{_yaml(value)}`"


def _yaml(value) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _yaml_value(values: dict, key: str) -> str:
    for part in key.split("."):
        if not isinstance(values, dict) or part not in values:
            return ""
        values = values[part]
    return "required" if values == "???" else f"`{_yaml(values)}`"


def _comments(schema) -> dict[str, str]:
    """Each field's comment in the source: full-line comments above it, and the one at the end of its line(s)."""
    notes = {}
    for cls in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        above, last = [], None
        for line in inspect.getsource(cls).splitlines()[1:]:
            text = line.strip()
            if text.startswith("def "):
                break
            field = re.match(r"(\w+)\s*:", text)
            comment = re.search(r"\s#\s*(.*)$", line)
            if text.startswith("#"):
                above.append(text.lstrip("# "))
            elif field and field.group(1) in cls.__annotations__:
                last = field.group(1)
                notes[last] = " ".join(above + ([comment.group(1)] if comment else []))
                above = []
            elif comment and last:  # the comment of a field written over several lines
                notes[last] = (notes[last] + " " + comment.group(1)).strip()
    return notes


def _defaults(path: Path) -> dict[str, str]:
    """The option each group takes in a primary config's defaults list (`optim@finetune.optim: sgd` too)."""
    out = {}
    for item in yaml.safe_load(path.read_text())["defaults"]:
        if isinstance(item, dict):
            ((group, option),) = item.items()
            if not group.startswith("override"):
                out[group.partition("@")[2] or group] = option
    return out


def _options(folder: Path) -> str:
    return ", ".join(f"`{p.stem}`" for p in sorted(folder.glob("*.yaml")))
