"""How promptly a short run ends: `python main_pretrain.py trainer.max_steps=1` (the digits, or the overrides given)
launched as a user launches it; prints the seconds from the launch to its `done:` line, from `done:` to the process's
exit, and the evaluations it ran (the val/acc1 records of its metrics.jsonl).

    python bench/exit.py [OVERRIDE ...]        # e.g. data=imagefolder data.root=photos data.image_size=64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(overrides: list[str]) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="solo-exit-")) / "run"
    command = [sys.executable, "main_pretrain.py", "trainer.max_steps=1", *overrides, f"hydra.run.dir={run_dir}"]
    started, done = time.perf_counter(), None
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("done:") and done is None:
            done = time.perf_counter()
    proc.wait()
    ended = time.perf_counter()
    if proc.returncode != 0 or done is None:
        sys.exit(f"the run failed (exit status {proc.returncode})")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = sum("val/acc1" in r for r in records)
    print(f"launch to done: {done - started:.1f} s; done: to exit {ended - done:.2f} s; evaluations {evaluations}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="main_pretrain.py overrides (default: the digits)")
    main(parser.parse_args().overrides)
