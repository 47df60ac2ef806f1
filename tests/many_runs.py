"""Several pretraining runs, one after another, in one launch, for tests: each process imports torch, torchvision and
solo once (about 9 s of this machine's time per process) instead of once per run. Each run is what
`main_pretrain.py` with those overrides does, in its own run directory and process group.

    torchrun --nproc_per_node=W tests/many_runs.py RUNS.json     # [[run_dir, [override, ...]], ...]
"""

import json
import os
import sys
from pathlib import Path

from solo.train.trainer import pretrain
from tests.test_train import compose_cfg


def main(runs_file: str) -> None:
    for index, (run_dir, overrides) in enumerate(json.loads(Path(runs_file).read_text())):
        # Each run joins a new process group; solo keeps each group's keys in torchrun's store apart by the restart
        # count (solo.distributed.env), which a new run must therefore change as a restart does.
        os.environ["TORCHELASTIC_RESTART_COUNT"] = f"run{index}"
        pretrain(compose_cfg(overrides), run_dir)


if __name__ == "__main__":
    main(*sys.argv[1:])
