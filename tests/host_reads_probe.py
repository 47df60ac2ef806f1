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
import threading

import torch

from solo.train import trainer as trainer_module
from solo.train.preemption import Preemption
from solo.train.step import TrainStep

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu")
events: list = []
where: list = []  # the stack of regions entered: [(region, step)]


def _recording(name, original):
    def read(self, *args, **kwargs):
        # The training thread's reads: the checkpoint writer's thread reads its own host copies meanwhile.
        if where and threading.current_thread() is threading.main_thread():
            events.append({"region": where[-1][0], "step": where[-1][1], "read": name})
        return original(self, *args, **kwargs)

    return read


def _region(region, original, step_of):
    def call(self, *args, **kwargs):
        where.append((region, step_of(self, *args)))
        try:
            return original(self, *args, **kwargs)
        finally:
            where.pop()

    return call


for _name in READS:
    setattr(torch.Tensor, _name, _recording(_name, getattr(torch.Tensor, _name)))
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
