"""Every place a computation reads a tensor's values on the host, recorded: on a GPU each one waits for the queue of
kernels to drain (torch.cuda.set_sync_debug_mode reports them there; this works on the CPU too, so the test suite
can hold every method's training step to none).

    with HostReads() as reads:
        train_step(batch, index)
    assert not reads.found, reads.report()

What counts: a scalar read (`.item()`, `bool()`, `int()`, `float()` of a tensor, `if tensor:`), `.tolist()`,
`.numpy()`, and the operations whose output size or error check depends on values (`nonzero`, boolean-mask
indexing, `masked_select`, `unique`, `repeat_interleave` without `output_size`, `bincount`, the error checks of
`torch.linalg` (cholesky, inv, solve, ...: their `_ex` forms do not check)). Each read is recorded with the
innermost frames of solo's own code that led to it.
"""

from __future__ import annotations

import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Operators that read values on the host: a scalar, a value-dependent output size, or a value-dependent error.
_SYNCING_OPS = {
    aten._local_scalar_dense.default: "a scalar read (.item(), bool(), int(), float())",
    aten.nonzero.default: "nonzero (output size depends on values)",
    aten.masked_select.default: "masked_select (output size depends on values)",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.bincount.default: "bincount (its length depends on the largest value)",
    aten._linalg_check_errors.default: "a torch.linalg error check (use the _ex form)",
}
_SYNCING_METHODS = {
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
}
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the solo package


class HostReads:
    """A context manager that records every host read of tensor values made inside it (see the module docstring).

    `found` lists (what, where) pairs; `where` is the innermost frames of solo's code, or of the caller when none.
    """

    def __init__(self):
        self.found: list[tuple[str, str]] = []
        self._dispatch, self._function = _DispatchReads(self), _FunctionReads(self)

    def __enter__(self) -> HostReads:
        self._function.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._dispatch.__exit__(*exc)
        self._function.__exit__(*exc)

    def record(self, what: str) -> None:
        frames = [
            f
            for f in traceback.extract_stack()
            if f.filename != __file__ and "/torch/" not in f.filename.replace(os.sep, "/")
        ]
        ours = [f for f in frames if f.filename.startswith(_HERE)] or frames[-1:]
        self.found.append((what, " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in ours[::-1][:3])))

    def report(self) -> str:
        return "\n".join(f"{what} at {where}" for what, where in self.found)


class _DispatchReads(TorchDispatchMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = _SYNCING_OPS.get(func)
        if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            what = "repeat_interleave without output_size"
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and any(
            i is not None and i.dtype == torch.bool for i in args[1]
        ):
            what = "boolean-mask indexing (output size depends on values)"
        if what:
            self.reads.record(what)
        return func(*args, **kwargs)


class _FunctionReads(TorchFunctionMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        what = _SYNCING_METHODS.get(func)
        if what:
            self.reads.record(what)
        return func(*args, **(kwargs or {}))
