"""The README's and the documentation's command blocks, run as a reader would: each page's ```bash and ```python
blocks in order, in a fresh directory, with the training commands shortened (SHORT below). A block that cannot run
on a CPU machine without downloads says why on the line before its fence (NOT_RUN); a file the reader is told to
write (`<!-- file: path -->` before its block) is written; a block that repeats another page's commands
(`<!-- same as: README.md -->`, the home page's quick start) runs there, and is checked to hold only commands of that
page. `pip install` and `pytest` lines are CI's own steps."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
NOT_RUN = ("needs a GPU", "needs external data", "needs several nodes")
MARK = re.compile(r"<!-- (not run|file|same as): (.+?) -->")
# What each kind of command gets appended, key by key (a key the command already sets keeps its value).
SHORT = {
    "main_pretrain.py": [
        "trainer.max_steps=2",
        "trainer.plots=false",
        "trainer.progress_bar=false",
        "backbone=resnet18_half",
    ],
    "main_linear.py": ["linear.epochs=2", "finetune.epochs=1", "feature_cache=false", "plots=false"],
}
SCRIPTS = {"solo-pretrain": "main_pretrain.py", "solo-linear": "main_linear.py"}


def blocks(page: Path) -> list[tuple[str, str, str | None, str | None]]:
    """(language, body, not-run reason, file path) of each fenced block of `page`, in order."""
    text, found, start = page.read_text(), [], 0
    for match in re.finditer(r"^```([\w-]*)\n(.*?)^```$", text, re.M | re.S):
        before = text[start : match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        start = match.end()
        mark = MARK.fullmatch(before.strip())
        reason = None
        if mark and mark.group(1) == "not run":
            reason = mark.group(2)
        elif mark and mark.group(1) == "same as":
            reason = f"same as: {mark.group(2)}"
        path = mark.group(2) if mark and mark.group(1) == "file" else None
        found.append((match.group(1), match.group(2), reason, path))
    return found


def commands(body: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def shortened(words: list[str]) -> list[str] | None:
    """The command to run for `words` (None: nothing to run here): scripts resolved in the repository, training
    shortened, the checker at W = 2 on the losses named (or on SimCLR's). `pip install` and `pytest` are CI's own
    steps; a measurement (bench/, scripts/) must name a script that exists, and tests/test_layers.py runs each with
    --help in one interpreter (one process per command here would cost a torch import each)."""
    if words[:2] == ["pip", "install"] or words[0] == "pytest":  # CI's own install and test steps
        return None
    if words[0] in SCRIPTS:
        words = ["python", SCRIPTS[words[0]], *words[1:]]
    if words[0] == "solo-check":
        words = ["python", "-m", "solo.losses.check", *words[1:]]
    if words[0] == "torchrun":
        script = next((i for i, w in enumerate(words) if not w.startswith("-") and i), len(words))  # torchrun's own
        words = [sys.executable, "-m", "torch.distributed.run", *words[1:script], "--standalone", *words[script:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is not None and (REPO / words[script]).exists():  # else a script the reader wrote (<!-- file: -->)
        name = words[script]
        words[script] = str(REPO / name)
        if name.startswith(("bench/", "scripts/")):
            return None
        keys = {w.split("=", 1)[0] for w in words[script + 1 :]}
        words += [o for o in SHORT.get(name, []) if o.split("=", 1)[0] not in keys]
    if words[1:3] == ["-m", "solo.losses.check"]:  # the whole checker runs in tests/test_distributed.py
        if "--only" not in words:  # the losses the command names, else one registered loss
            words += ["--only"] + ([] if any(not w.startswith("-") for w in words[3:]) else ["nt_xent"])
        words += [] if "--world-sizes" in words else ["--world-sizes", "2"]
    return words


def runnable(lang: str, body: str, reason: str | None, path: str | None) -> bool:
    return lang in ("bash", "python") and reason is None and path is None


def test_every_block_runs_or_says_why_not():
    """Parsing only (fast): each runnable block is bash or python, each mark is one this test knows, and a block
    marked `same as: PAGE` holds only commands that a block of PAGE runs."""
    for page in PAGES:
        for lang, body, reason, path in blocks(page):
            where = f"{page.relative_to(REPO)}: ```{lang} {body.splitlines()[0] if body else ''}"
            if reason is not None and reason.startswith("same as: "):
                other = REPO / reason.removeprefix("same as: ")
                ran = [words for block in blocks(other) if runnable(*block) for words in commands(block[1])]
                missing = [shlex.join(words) for words in commands(body) if words not in ran]
                assert commands(body) and not missing, f"{where}: {missing} not run by {other.name}'s blocks"
                continue
            assert reason is None or reason in NOT_RUN, f"{where}: unknown reason {reason!r}; one of {NOT_RUN}"
            if runnable(lang, body, reason, path):
                assert commands(body) if lang == "bash" else body.strip(), f"{where}: an empty block"


def starts_process_groups(page: Path) -> bool:
    """Whether a block the test runs starts process groups (tests/conftest.py: those run one at a time)."""
    ran = [shortened(words) for block in blocks(page) if runnable(*block) for words in commands(block[1])]
    return any(c and ("torch.distributed.run" in c or "solo.losses.check" in c) for c in ran)


# Pages whose commands CI leaves to `pytest -m exhaustive`: the entry points and flags they use are run in CI by the
# README's and the other pages' commands and by the tests of each feature (evaluation, launches, extensions, CLIP).
NOT_IN_CI = {
    "docs/evaluation.md",
    "docs/tutorial.md",
    "docs/distributed.md",
    "docs/extending.md",
    "docs/methods/clip.md",
}


def page_case(page: Path):
    marks = [] if starts_process_groups(page) else [pytest.mark.one_process]
    marks += [pytest.mark.exhaustive] if str(page.relative_to(REPO)) in NOT_IN_CI else []
    return pytest.param(page, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [page_case(p) for p in PAGES if any(runnable(*b) for b in blocks(p))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_page_commands_run(page, tmp_path):
    # The reader's own modules (imports=[...]) are found from where they work, as with `export PYTHONPATH=$PWD`.
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    for lang, body, reason, path in blocks(page):
        if reason is not None:
            continue
        if path is not None:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(body + "\n")
            continue
        if lang == "python":
            run = [sys.executable, "-c", body]
        elif lang == "bash":  # one shell per block, so that `export` and `cd` hold for the block's later lines
            script = "\n".join(shlex.join(w) for w in map(shortened, commands(body)) if w is not None)
            run = ["bash", "-euo", "pipefail", "-c", script]
        else:
            continue
        result = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
        assert result.returncode == 0, f"{page.name}: {run[-1]}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_lists_start_after_a_blank_line():
    """Parsing only (fast): in the site's pages a list starts after a blank line. Python-Markdown, unlike GitHub,
    reads a list written right under a line of a paragraph as more of the paragraph, one run-on line of dashes."""
    item = re.compile(r"\s*([-*+]|\d+\.)\s")
    for page in sorted((REPO / "docs").rglob("*.md")):
        lines, inside = page.read_text().splitlines(), None  # inside a ``` fence or a $$ formula
        for i, line in enumerate(lines):
            fence = line.strip()
            mark = "```" if fence.startswith("```") else "$$" if fence.startswith("$$") else None
            if mark and not (mark == "$$" and len(fence) > 2 and fence.endswith("$$")):  # not a one-line formula
                inside = None if inside == mark else inside or mark
                continue
            before = lines[i - 1] if i else ""
            text = (
                before.strip()
                and not before.startswith((" ", "\t", "|", "#", "!!!", "<!--"))
                and not item.match(before)
            )
            assert inside or not (item.match(line) and text), (
                f"{page.relative_to(REPO)}:{i + 1}: a blank line before the list"
            )
