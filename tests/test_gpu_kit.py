"""bench/gpu.sh --dry-run: the GPU kit's whole driver on the CPU at toy sizes, so that it still runs when a GPU
window comes; and a step past its time limit is killed, marked, and the report written all the same."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train import REPO

# The report's sections, in order: the steps the kit is for (bench/gpu.sh's header).
STEPS = (
    "1. SyncBatchNorm",
    "2. Gradient accumulation",
    "3. Throughput and peak memory",
    "4. Kernel launches per step",
    "5. The augmentation on the device",
    "6. torch.compile",
    "7. Host syncs",
    "8. W = 1 against W = N over NCCL",
)


def run_kit(report: Path, **env) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the kit's python3 is this one
    return subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh"), "--dry-run", str(report)],
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def sections(report: Path) -> dict[str, str]:
    """{title: body} of the report's `## ` sections."""
    parts = re.split(r"^## (.+)$", report.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def table_rows(body: str) -> list[list[str]]:
    """The cells of the body's tables' rows, without their headers and rules."""
    lines = body.splitlines()
    rule = [line.startswith("|---") for line in lines]
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for i, line in enumerate(lines)
        if line.startswith("|") and not rule[i] and not (i + 1 < len(lines) and rule[i + 1])
    ]


def numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"(?<![\w.])\d[\d,]*\.?\d*(?:e[+-]\d+)?", text)]


@pytest.mark.slow  # 25-33 s of 2 busy cores: the quick suite keeps under 4 min without it
def test_the_dry_run_fills_every_section(tmp_path):
    report = tmp_path / "report.md"
    proc = run_kit(report)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sections(report)
    assert len(found) == len(STEPS) and all(map(str.startswith, found, STEPS)), list(found)
    for title, body in list(found.items())[:-1]:
        assert body.strip().startswith("_finished in"), f"{title}: {body[:500]}"
        rows = table_rows(body)
        assert rows and all(numbers(" ".join(row[1:])) for row in rows), f"{title}: a row without figures\n{body}"
        assert "nan" not in body.lower() and "inf " not in body.lower(), f"{title}\n{body}"
    assert "not run: the CPU (dry run)" in found[list(found)[-1]]

    # The exactness the kit reports, against one BatchNorm and the unaccumulated step: float64 rounding.
    batchnorm = table_rows(next(b for t, b in found.items() if t.startswith("1.")))
    float64 = [row for row in batchnorm if row[0] == "float64"]
    assert float64 and max(max(numbers(row[2])) for row in float64) < 1e-10, float64
    float32 = [row for row in batchnorm if row[0] == "float32"]
    assert float32 and 1e-9 < max(max(numbers(row[2])) for row in float32) < 1e-4, float32  # float32's rounding
    (accumulated,) = table_rows(next(b for t, b in found.items() if t.startswith("2.")))
    assert numbers(accumulated[-1])[0] < 1e-10, accumulated
    throughput = table_rows(next(b for t, b in found.items() if t.startswith("3.")))
    assert len(throughput) == 4 and all(numbers(row[2])[0] > 0 and numbers(row[3])[0] > 0 for row in throughput)


def leftover_processes(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.mark.slow  # 11 s
def test_a_step_past_its_limit_is_stopped_and_marked(tmp_path):
    report = tmp_path / "report.md"
    proc = run_kit(report, STEP_TIMEOUT="0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sections(report)
    assert len(found) == len(STEPS) and all(map(str.startswith, found, STEPS)), list(found)
    throughput = next(b for t, b in found.items() if t.startswith("3."))
    assert throughput.strip().startswith("_did not finish: stopped after 0.5 s, its limit_"), throughput
    for title, body in list(found.items())[:-1]:  # the quick ones may finish within the limit
        assert body.strip().startswith(("_finished in", "_did not finish: stopped after 0.5 s")), f"{title}: {body}"
    assert not leftover_processes(str(tmp_path)), "the stopped steps' processes are still running"
