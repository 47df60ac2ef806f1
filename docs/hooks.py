"""MkDocs hook: replaces markers in the pages with tables generated from solo's code at build time, so they cannot
drift from it.

- `<!-- config-reference -->`: every config key. The trainer's schemas (solo.config: the top level of
  main_pretrain.py and main_linear.py, `trainer`, `augmentation`, `linear`, `knn`, `finetune`) and, for every entry
  of every registry that is a config group (`solo.config.registered_groups()`: method, data, backbone, optim,
  logger), a heading and a table of its keys: type, schema default, the value its YAML option in solo/configs sets,
  the rule or choices recorded on the field (solo.schema), and the comment beside the field in the source.
- `<!-- config-groups -->`: every option of every config group (each folder of YAML files under solo/configs/, and
  every name registered in `solo.config.registered_groups()`), one line each: a method's module docstring's first
  sentence, else the option's YAML file's leading comment's, else its registered class's or function's docstring's,
  else the values the file sets.
- `<!-- config-keys: SECTION -->`: the keys of one of the trainer's schemas (`trainer`), each linked to its row in the
  configuration reference.
- `<!-- zoo-table -->`: the checkpoint zoo (zoo/manifest.json) as `solo.zoo.manifest.markdown_table` renders it;
  `<!-- zoo-table: METHOD -->`: the same for that method's entries only.
- `<!-- zoo-result: ENTRY KIND[/KIND...] -->`: the top-1 accuracies of one zoo entry from the manifest, e.g.
  `<!-- zoo-result: clip-digits-resnet18half linear/knn/zero_shot -->` gives `0.964 / 0.958 / 0.919`, so a number
  quoted in prose or in another table is the zoo's.

`on_files` adds MathJax (from the `django-static-mathjax` package of the `docs` extra) to the site, so
that formulas render with no network request.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import inspect
import posixpath
import re
import typing
from pathlib import Path

import yaml

CONFIG_MARKER = "<!-- config-reference -->"
GROUPS_MARKER = "<!-- config-groups -->"
KEYS_MARKER = re.compile(r"<!-- config-keys:\s*(\w+)\s*-->")
ZOO_MARKER = re.compile(r"<!-- zoo-table(?::\s*(\w+))?\s*-->")
RESULT_MARKER = re.compile(r"<!-- zoo-result:\s*([\w.-]+)\s+([\w/]+)\s*-->")


def on_page_markdown(markdown, page, config, files):
    root = posixpath.relpath(".", posixpath.dirname(page.file.src_uri) or ".")  # the docs folder, from this page
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if GROUPS_MARKER in markdown:
        markdown = markdown.replace(GROUPS_MARKER, config_groups(root))
    markdown = KEYS_MARKER.sub(lambda m: config_keys(m.group(1), root), markdown)
    markdown = RESULT_MARKER.sub(lambda m: zoo_result(m.group(1), m.group(2)), markdown)
    return ZOO_MARKER.sub(lambda m: zoo_table(m.group(1)), markdown)


# --- MathJax, served from the site itself -------------------------------------------------------------------

# What the site needs of MathJax 3's es5 build: the combined TeX/MathML + CommonHTML file that mkdocs.yml loads, and
# what it loads itself on demand (CommonHTML's fonts, TeX extensions for \require and autoload, the menu and the
# accessibility tools). The other combined builds and the SVG output are left out.
MATHJAX_BUNDLE = "tex-mml-chtml.js"
MATHJAX_PARTS = ("a11y", "adaptors", "input", "output/chtml", "sre", "ui")
MATHJAX_SITE = "javascripts/mathjax"


def mathjax_files() -> dict[str, Path]:
    """Site path -> file of MathJax's es5 build as the django-static-mathjax package (the `docs` extra) ships it."""
    try:
        dist = importlib.metadata.distribution("django-static-mathjax")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            "the documentation renders its formulas with the MathJax that django-static-mathjax ships: "
            'pip install -e ".[docs]"'
        ) from None
    es5 = Path(dist.locate_file("mathjax/static/mathjax/es5"))
    found = {f"{MATHJAX_SITE}/{MATHJAX_BUNDLE}": es5 / MATHJAX_BUNDLE}
    for part in MATHJAX_PARTS:
        for path in sorted((es5 / part).rglob("*")):
            if path.is_file():
                found[f"{MATHJAX_SITE}/{path.relative_to(es5).as_posix()}"] = path
    return found


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri, path in mathjax_files().items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


# --- the zoo -----------------------------------------------------------------------------------------------


def zoo_table(method: str | None) -> str:
    from solo.zoo.manifest import markdown_table, read_manifest

    entries = [e for e in read_manifest() if method is None or e["method"] == method]
    return markdown_table(entries) if entries else f"No zoo entry yet for `{method}`."


def zoo_result(name: str, kinds: str) -> str:
    """`0.964 / 0.958`: entry `name`'s top-1 for each of `kinds` (linear/knn/zero_shot), as the zoo table rounds it."""
    from solo.zoo.manifest import read_manifest

    entry = next((e for e in read_manifest() if e["name"] == name), None)
    if entry is None:
        raise ValueError(f"<!-- zoo-result: {name} {kinds} -->: no zoo entry {name!r} in zoo/manifest.json")
    missing = [k for k in kinds.split("/") if k not in entry["results"]]
    if missing:
        raise ValueError(f"<!-- zoo-result: {name} {kinds} -->: {name} has no {missing} result")
    return " / ".join(f"{entry['results'][k]['acc1']:.3f}" for k in kinds.split("/"))


# --- the config groups' options ----------------------------------------------------------------------------

# Groups that pretrain.yaml does not select directly: how an option of theirs is chosen.
CHOSEN_INSIDE = {
    "text": "CLIP's and SigLIP's text tower: `text@method.text=<option>` (default `tiny`).",
    "trainer": "A method's digits length: its YAML lists `/trainer@_global_.trainer: epochs_<n>`; "
    "`trainer.max_epochs=<n>` on the command line wins.",
}


def config_groups(root: str = ".") -> str:
    """For each config group, how to select an option and a table of the options with a line on each. `root`: the
    docs folder relative to the page, for the links."""
    import solo.config as sc
    import solo.configs

    configs = Path(solo.configs.__file__).parent
    defaults = _defaults(configs / "pretrain.yaml")
    registries = sc.registered_groups()
    folders = sorted(p.name for p in configs.iterdir() if p.is_dir() and p.name != "hydra" and any(p.glob("*.yaml")))
    order = [g for g in defaults if g in folders or g in registries]  # pretrain.yaml's order, then the rest
    order += [g for g in [*folders, *registries] if g not in order]
    reference = f"{root}/reference/config.md"
    out = []
    for group in dict.fromkeys(order):
        folder, registry = configs / group, registries.get(group)
        yamls = {p.stem: p for p in sorted(folder.glob("*.yaml"))}
        if group in defaults:
            default = f"`{defaults[group]}`" if defaults[group] is not None else "none"
            how = f"`{group}=<option>` (default {default})."
        else:
            how = CHOSEN_INSIDE.get(group, f"Selected inside other options (`/{group}@...` in their defaults).")
        if registry is not None:
            anchor = f"{reference}#{group}"
            how += f" Registered: `{registry.describe()}`; every key: [configuration reference]({anchor})."
        elif group == "augmentation":
            how += f" Every key: [configuration reference]({reference}#augmentation)."
        rows = ["| option | what |", "|---|---|"]
        lines = {option: _option_line(group, option, path, registry, root) for option, path in yamls.items()}
        for option, line in lines.items():
            if list(lines.values()).count(line) > 1:  # one comment shared by several files: say what each sets
                line = f"{line} {_sets(yamls[option])}".strip()
            rows.append(f"| `{option}` | {_escape(line)} |")
        if registry is not None:  # registered names that no YAML file selects: `group.name=<name>`
            for name in registry.names():
                selected = any(_resolves(registry, _yaml_name(p), registry[name]) for p in yamls.values())
                if not selected:
                    rows.append(f"| `{group}.name={name}` | {_escape(_registered_line(group, registry[name], root))} |")
        out += [f"### `{group}` {{#group-{group}}}", "", how, "", *rows, ""]
    return "\n".join(out)


def config_keys(section: str, root: str = ".") -> str:
    """The keys of one of the trainer's schemas, and a link to their table in the configuration reference."""
    import solo.config as sc

    schema = {"trainer": sc.TrainerConfig, "augmentation": sc.AugmentationConfig}[section]
    keys = ", ".join(f"`{key}`" for key, *_ in _fields(schema, "", {}))
    return f"{keys} (each described in the [configuration reference]({root}/reference/config.md#{section}))"


def _option_line(group: str, option: str, path: Path, registry, root: str) -> str:
    """One line on an option: for a method its module docstring's first sentence and its page, else the YAML's
    leading comment's first sentence, else the registered entry's docstring's, else what the file sets."""
    entry = None
    if registry is not None:
        try:
            entry = registry[_yaml_name(path)]
        except Exception:
            entry = None
    if group == "method" and entry is not None:
        return _registered_line(group, entry, root)
    line = _first_sentence(_leading_comment(path))
    if not line and entry is not None:
        line = _first_sentence(_docstring(entry.target))
    return line or _sets(path)


def _registered_line(group: str, entry, root: str) -> str:
    if group == "method":
        doc = inspect.getdoc(inspect.getmodule(entry.target)) or inspect.getdoc(entry.target) or ""
        return f"{_first_sentence(doc)} [Page]({root}/methods/{entry.name}.md)."
    return _first_sentence(_docstring(entry.target)) or f"Registered by `{entry.target.__module__}`."


def _docstring(obj) -> str:
    """Its own docstring (not a dataclass's generated signature)."""
    doc = inspect.getdoc(obj) or ""
    return "" if re.match(rf"{re.escape(getattr(obj, '__name__', ''))}\(", doc) else doc


def _yaml_name(path: Path) -> str:
    return (yaml.safe_load(path.read_text()) or {}).get("name", path.stem)


def _leading_comment(path: Path) -> str:
    """The comment lines a YAML file starts with (Hydra's `# @package` directive left out)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line.lstrip("#").strip())
    return " ".join(lines)


# Abbreviations whose period ends no sentence.
_ABBREVIATIONS = ("al", "e.g", "i.e", "sec", "cf", "vs", "approx", "eq", "fig", "no")


def _first_sentence(text: str, limit: int = 240) -> str:
    """The first sentence of `text` (the first paragraph, whitespace collapsed). One longer than `limit` characters
    is cut at its first colon outside parentheses ("Barlow Twins, ResNet-50, ImageNet at 224px: ..."), else at its
    last clause boundary before `limit`."""
    text = " ".join(text.split("\n\n")[0].split())
    for m in re.finditer(r"\.(?=\s+[A-Z`(\"']|$)", text):
        word = re.search(r"([\w.]+)$", text[: m.start()])
        if not (word and word.group(1).lower() in _ABBREVIATIONS):
            text = text[: m.end()]
            break
    if len(text) <= limit:
        return text
    depth, bounds = 0, []  # clause boundaries outside parentheses
    for i, char in enumerate(text[:limit]):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text[i : i + 2] in (": ", "; ", ", "):
            bounds.append((i, char))
    colon = next((i for i, char in bounds if char == ":" and i >= 20), None)
    if colon is not None:
        return text[:colon] + ": ..."
    cut = max((i for i, _ in bounds if i > limit // 2), default=limit)
    return text[:cut].rstrip(" ,;:(") + " ..."


def _sets(path: Path) -> str:
    """What an option's YAML file sets, for a file with no comment: its top-level values."""
    values = {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}
    return "Sets " + ", ".join(f"`{k}: {_yaml(v)}`" for k, v in values.items()) + "." if values else ""


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


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
