"""Imported into a training run (`imports=[tests.host_reads_probe]`): records every read of a tensor's value on
the host (on a GPU each one is a synchronisation) by the training thread and where the trainer was, into
$HOST_READS_LOG.<rank>.

Regions: "step" (inside TrainStep.__call__, with the step's index), "loop" (the loop's own per-step work:
moving the batch, summing the metrics window); and "preemption_check", the step at which the trainer asked
whether to stop (it reads a flag). Reads elsewhere (data loading, logging, evaluation) are not recorded.
"""

from __future__ import annotations

import atexit
import json
import os

from solo.train import trainer as trainer_module
from solo.train.host_reads import HostReads
from solo.train.preemption import Preemption
from solo.train.step import TrainStep

where: list = []  # the stack of regions entered: [(region, step)]
events: list = []


def _region(region, original, step_of):
    def call(self, *args, **kwargs):
        # The training thread's reads (solo.train.host_reads): the checkpoint writer's thread reads its own host
        # copies meanwhile, and a mode is per thread.
        where.append((region, step_of(self, *args)))
        try:
            with HostReads() as reads:
                return original(self, *args, **kwargs)
        finally:
            step = where.pop()[1]
            events.extend({"region": region, "step": step, "read": f"{what} at {at}"} for what, at in reads.found)

    return call


_step, _add, _to_device, _requested = (
    TrainStep.__call__,
    trainer_module.MetricsWindow.add,
    trainer_module.Trainer._to_device,
    Preemption.requested,
)
steps_done = [0]  # the trainer's step count, as its loop sees it after a step


def _counted_step(self, batch, index):
    steps_done[0] = index + 1
    return _region("step", _step, lambda self, batch, index: index)(self, batch, index)


def _recorded_request(self):
    events.append({"region": "preemption_check", "step": steps_done[0], "read": None})
    return _requested(self)


TrainStep.__call__ = _counted_step
trainer_module.MetricsWindow.add = _region("loop", _add, lambda self, *a: None)
trainer_module.Trainer._to_device = _region("loop", _to_device, lambda self, *a: None)
Preemption.requested = _recorded_request


@atexit.register
def _write():
    with open(f"{os.environ['HOST_READS_LOG']}.{os.environ.get('RANK', '0')}", "w") as f:
        json.dump(events, f)
