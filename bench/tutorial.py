"""The tutorial (docs/tutorial.md) as a reader runs it, in full: every command of the page in order, in a fresh
directory, nothing shortened (tests/test_docs.py runs the same commands with 2 training steps). Prints the time of
each command and what the page promises: the linear probe and k-NN of the pretrained backbone, and of the same
architecture untrained (`random_init=true`), read from each evaluation's summary.json.

    python bench/tutorial.py [--dir DIR]       # DIR: where the reader works (default: a temporary directory)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_docs import blocks, commands  # noqa: E402  (the page's parser: the same blocks the docs test runs)

PAGE = REPO / "docs" / "tutorial.md"


def resolved(words: list[str]) -> list[str]:
    """A page's command as this checkout runs it: python as this interpreter, the repository's scripts by path."""
    if words[0] == "python":
        words = [sys.executable, *words[1:]]
    return [str(REPO / w) if w.endswith(".py") and (REPO / w).exists() else w for w in words]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="solo-tutorial-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(REPO)}
    started, evaluations = time.perf_counter(), []
    for lang, body, reason, path in blocks(PAGE):
        if reason is not None:
            continue
        if path is not None:
            (work / path).write_text(body + "\n")
            continue
        if lang not in ("bash", "python"):  # what the page shows a run printing
            continue
        runs = [resolved(w) for w in commands(body)] if lang == "bash" else [[sys.executable, "-c", body]]
        for words in runs:
            begun = time.perf_counter()
            done = subprocess.run(words, cwd=work, capture_output=True, text=True, env={**os.environ, **env})
            shown = shlex.join(words).replace(str(REPO) + "/", "").replace(sys.executable, "python")
            print(f"{time.perf_counter() - begun:7.1f} s  {shown[:150]}", flush=True)
            if done.returncode != 0:
                sys.exit(f"failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            if "main_linear.py" in shown:
                evaluations.append((shown, _summary(done.stdout + done.stderr, work)))
    print(f"{time.perf_counter() - started:7.1f} s  in all, in {work}")
    for shown, results in evaluations:
        print(f"{'random init' if 'random_init=true' in shown else 'pretrained'}: {results}")


def _summary(output: str, work: Path) -> str:
    """The linear and k-NN top-1 of an evaluation, from the summary.json its last lines name."""
    written = [line.split("written to ", 1)[1].strip() for line in output.splitlines() if "written to " in line]
    summary = json.loads((work / written[-1]).read_text()) if written else {}
    found = [f"{kind} {summary[kind]['acc1']:.3f}" for kind in ("linear", "knn") if kind in summary]
    return ", ".join(found) or output[-500:]


if __name__ == "__main__":
    main()
