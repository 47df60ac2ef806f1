"""Getting a zoo entry's weights file: from the repository or a URL, cached, checked against its sha256."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from solo.zoo.manifest import manifest_path
from solo.zoo.weights import sha256_file


class ChecksumError(RuntimeError):
    pass


def cache_dir() -> Path:
    """$SOLO_CACHE, else ~/.cache/solo: downloaded zoo files and cached features live under it."""
    return Path(os.environ.get("SOLO_CACHE", Path.home() / ".cache" / "solo"))


def is_offline() -> bool:
    return os.environ.get("SOLO_OFFLINE", "0").lower() in ("1", "true", "yes")


def entry_file(entry: dict, *, cache: str | Path | None = None, offline: bool | None = None) -> Path:
    """A verified local path to the entry's file; a size or sha256 mismatch refuses to return it."""
    location = entry["file"]["location"]
    if "://" not in location:  # a path in the repository, relative to the manifest's parent
        path = manifest_path().resolve().parent.parent / location
        if not path.exists():
            raise FileNotFoundError(f"zoo entry {entry['name']!r}: {path} does not exist")
        verify(path, entry)
        return path
    offline = is_offline() if offline is None else offline
    target = Path(cache or cache_dir() / "zoo") / entry["file"]["sha256"] / Path(location).name
    if target.exists():
        verify(target, entry)
        return target
    if offline:
        raise FileNotFoundError(
            f"zoo entry {entry['name']!r} is not in the cache ({target}) and offline use is on "
            "(SOLO_OFFLINE=1 or offline=True): download it once with network access, or copy the file there"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        with urllib.request.urlopen(location) as response:
            shutil.copyfileobj(response, tmp)
    try:
        verify(Path(tmp.name), entry)
    except ChecksumError:
        os.unlink(tmp.name)
        raise
    os.replace(tmp.name, target)
    return target


def verify(path: Path, entry: dict) -> None:
    expected = entry["file"]
    size = path.stat().st_size
    digest = sha256_file(path) if size == expected["size"] else None
    if size != expected["size"] or digest != expected["sha256"]:
        raise ChecksumError(
            f"refusing to load zoo entry {entry['name']!r}: {path} has size {size} and sha256 {digest or '(not computed)'}, "
            f"the manifest says size {expected['size']} and sha256 {expected['sha256']}. The file is corrupt or was "
            "modified: delete it (a cached download is fetched again) or restore it from the repository"
        )
