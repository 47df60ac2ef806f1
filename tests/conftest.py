"""The quick suite runs in 2 pytest-xdist workers (pytest.ini), one per core:

- each worker's torch uses one intra-op thread: 2 per worker would put 4 busy threads on 2 cores, which run slower
  than 2;
- the tests that start process groups (marked `processes`, and every slow test not marked `one_process`) all go to
  one worker, where they run one at a time as in a serial run: two 2-process groups at once would share 2 cores four
  ways. A slow test marked `one_process` computes in one process (this one, or one it starts), beside the others.
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
            item.add_marker(pytest.mark.xdist_group("processes"))
