"""The quick suite runs in 2 pytest-xdist workers (pytest.ini), one per core:

- each worker's torch uses one intra-op thread: 2 per worker would put 4 busy threads on 2 cores, which run slower
  than 2;
- the tests that start processes of their own (marked `processes`, and every slow test) all go to one worker, where
  they run one at a time as in a serial run: two 2-process groups at once would share 2 cores four ways.
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
        if item.get_closest_marker("processes") or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("processes"))
