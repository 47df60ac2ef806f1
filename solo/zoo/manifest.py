"""The zoo manifest (zoo/manifest.json): one entry per published checkpoint, validated on reading."""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFEST = REPO_ROOT / "zoo" / "manifest.json"

# field -> type, for every entry; results hold at least "linear" and "knn" (and "zero_shot" for CLIP).
ENTRY_FIELDS = {
    "name": str,
    "method": str,
    "contents": str,
    "backbone": dict,
    "data": dict,
    "epochs": int,
    "global_batch": int,
    "command": str,
    "results": dict,
    "file": dict,
}
FILE_FIELDS = {"location": str, "size": int, "sha256": str}
RESULT_FIELDS = {"acc1": float, "acc5": float, "protocol": str, "command": str}


class ManifestError(ValueError):
    pass


def manifest_path() -> Path:
    """$SOLO_ZOO_MANIFEST, else the repository's zoo/manifest.json."""
    return Path(os.environ.get("SOLO_ZOO_MANIFEST", MANIFEST))


def read_manifest(path: str | Path | None = None) -> list[dict]:
    path = Path(path) if path else manifest_path()
    if not path.exists():
        raise FileNotFoundError(
            f"zoo manifest {path} not found: run from a checkout of the repository, or set SOLO_ZOO_MANIFEST"
        )
    entries = json.loads(path.read_text())["entries"]
    names = [e.get("name") for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ManifestError(f"{path}: duplicate entry names {duplicates}")
    for entry in entries:
        validate_entry(entry, path)
    return entries


def validate_entry(entry: dict, where: str | Path = "manifest") -> None:
    name = entry.get("name", "<unnamed>")

    def check(fields: dict, obj: dict, prefix: str) -> None:
        for field, kind in fields.items():
            if field not in obj:
                raise ManifestError(f"{where}: entry {name!r} lacks '{prefix}{field}'")
            ok = isinstance(obj[field], kind) and not (kind is int and isinstance(obj[field], bool))
            if kind is float:
                ok = isinstance(obj[field], (int, float)) and not isinstance(obj[field], bool)
            if not ok:
                raise ManifestError(
                    f"{where}: entry {name!r} field '{prefix}{field}' must be {kind.__name__}, got {obj[field]!r}"
                )

    check(ENTRY_FIELDS, entry, "")
    check(FILE_FIELDS, entry["file"], "file.")
    if entry["contents"] not in ("backbone", "model"):
        raise ManifestError(
            f"{where}: entry {name!r} contents must be 'backbone' or 'model', got {entry['contents']!r}"
        )
    wanted = ["linear", "knn"] + (["zero_shot"] if entry["contents"] == "model" else [])
    for kind in wanted:
        if kind not in entry["results"]:
            raise ManifestError(f"{where}: entry {name!r} lacks results.{kind}")
    for kind, result in entry["results"].items():
        check(RESULT_FIELDS, result, f"results.{kind}.")
        for key in ("acc1", "acc5"):
            if not 0.0 <= result[key] <= 1.0:
                raise ManifestError(f"{where}: entry {name!r} results.{kind}.{key} = {result[key]} is not in [0, 1]")
    sha = entry["file"]["sha256"]
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ManifestError(f"{where}: entry {name!r} file.sha256 must be 64 lowercase hex digits, got {sha!r}")


def find_entry(name: str, path: str | Path | None = None) -> dict:
    entries = read_manifest(path)
    for entry in entries:
        if entry["name"] == name:
            return entry
    raise KeyError(f"no zoo entry named {name!r}; the zoo has: {', '.join(e['name'] for e in entries)}")


def markdown_table(entries: list[dict]) -> str:
    """The zoo table, generated from the manifest: the docs render it where a page says <!-- zoo-table --> (docs/hooks.py)."""
    rows = [
        "| name | method | backbone | data | epochs | global batch | linear top-1 | k-NN top-1 | zero-shot top-1 | size | sha256 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        r = e["results"]
        b = e["backbone"]
        backbone = b["name"] + (" " + ",".join(f"{k}={v}" for k, v in b["kwargs"].items()) if b["kwargs"] else "")
        backbone += ", small stem" if b["small_stem"] else ""
        zero_shot = f"{r['zero_shot']['acc1']:.3f}" if "zero_shot" in r else "-"
        rows.append(
            f"| `{e['name']}` | {e['method']} | {backbone} | {e['data']['name']} {e['data']['image_size']}px | "
            f"{e['epochs']} | {e['global_batch']} | {r['linear']['acc1']:.3f} | {r['knn']['acc1']:.3f} | {zero_shot} | "
            f"{e['file']['size'] / 2**20:.1f} MiB | `{e['file']['sha256'][:12]}` |"
        )
    return "\n".join(rows)
