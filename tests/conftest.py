"""The quick suite runs in 2 pytest-xdist workers (pytest.ini), one per core:

- each worker's torch uses one intra-op thread: 2 per worker would put 4 busy threads on 2 cores, which run slower
  than 2;
- the tests that start process groups (marked `processes`, and every slow test not marked `one_process`) go to the
  workers module by module (an xdist group per module), so that a module's launches that its tests share (its
  module-scoped fixtures) run once, on one worker. Two modules' process groups may run at once: their ranks wait on
  each other much of the time (gloo blocks, it does not spin), and the other module's processes take those cores.
  When they all went to one worker, one at a time, that worker was the slow suite's whole wall time and the 2 cores
  were busy 146% of it (the clean-clone CI of 211c252). A slow test marked `one_process` computes in one process
  (this one, or one it starts) and needs no module fixture: it runs on whichever worker is free.
"""

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch's import, for this process and what it starts
    import torch

    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        slow_groups = item.get_closest_marker("slow") and not item.get_closest_marker("one_process")
        if item.get_closest_marker("processes") or slow_groups:
            item.add_marker(pytest.mark.xdist_group(f"processes-{item.module.__name__}"))
