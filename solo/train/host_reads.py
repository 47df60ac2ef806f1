"""Every place a computation reads a tensor's values on the host, recorded: on a GPU each one waits for the queue of
kernels to drain (torch.cuda.set_sync_debug_mode reports them there; this works on the CPU too, so the test suite
can hold every method's training step to none).

    with HostReads() as reads:
        train_step(batch, index)
    assert not reads.found, reads.report()

What counts: a scalar read (`.item()`, `bool()`, `int()`, `float()` of a tensor, `if tensor:`), `.tolist()`,
`.numpy()`, `.cpu()`, the operations that return a host bool (`torch.equal`, `torch.allclose`), those whose output
size or error check depends on values (`nonzero`, boolean-mask indexing, `masked_select`, `unique`,
`repeat_interleave` without `output_size`, `bincount`, the error checks of `torch.linalg`: cholesky, inv, solve, ...,
whose `_ex` forms do not check, and eigh, svd, pinv, lstsq, eig, which have none), and a tensor made from host data
with a device given (`torch.tensor(x, device=...)`, `torch.as_tensor`, `Tensor.new_tensor`: on a GPU a blocking copy,
which waits for the queue; `torch.full` does not). Each read is recorded with the frame that made it and the
innermost frames of solo's own code that led to it.

What a run on the CPU cannot tell: which tensors a GPU run would keep on the host (reading those costs no sync, but
is counted here), and a copy of a host tensor to the device (`x.to(device)`), a no-op on the CPU, is not seen.
"""

from __future__ import annotations

import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Operators (all their overloads) that read values on the host: a scalar, a value-dependent output size, or a
# value-dependent error. The last ones read inside their kernel, where this mode does not see the read itself.
_SYNCING_OPS = {
    aten._local_scalar_dense: "a scalar read (.item(), bool(), int(), float())",
    aten.nonzero: "nonzero (output size depends on values)",
    aten.masked_select: "masked_select (output size depends on values)",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.unique_consecutive: "unique_consecutive",
    aten.bincount: "bincount (its length depends on the largest value)",
    aten._linalg_check_errors: "a torch.linalg error check (use the _ex form)",
    aten.equal: "torch.equal (a host bool)",
    aten.allclose: "torch.allclose (a host bool)",
    aten._linalg_eigh: "torch.linalg.eigh's error check",
    aten._linalg_svd: "torch.linalg.svd's error check",
    aten.linalg_pinv: "torch.linalg.pinv's error check (its svd's or eigh's)",
    aten.linalg_lstsq: "torch.linalg.lstsq's error check",
    aten.linalg_eig: "torch.linalg.eig (computed on the host)",
}
_SYNCING_METHODS = {
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.cpu: ".cpu() (a copy to the host)",
}
_FROM_HOST_DATA = "a tensor made from host data on the device (on a GPU a blocking copy; torch.full does not copy)"
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the solo package


class HostReads:
    """A context manager that records every host read of tensor values made inside it (see the module docstring).

    `found` lists (what, where) pairs; `where` is the frame that read (the innermost one outside torch: in solo, in
    a method or loss of your own) and the innermost frames of solo's code that led to it.
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
        site, callers = frames[-1], [f for f in frames[:-1] if f.filename.startswith(_HERE)]
        shown = [site, *callers[::-1]][:3]
        self.found.append((what, " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in shown)))

    def report(self) -> str:
        return "\n".join(f"{what} at {where}" for what, where in self.found)


class _DispatchReads(TorchDispatchMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = _SYNCING_OPS.get(func.overloadpacket)
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
        kwargs = kwargs or {}
        what = _SYNCING_METHODS.get(func)
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
            what = None if isinstance(args[0], torch.Tensor) else _FROM_HOST_DATA
        if func is torch.Tensor.new_tensor and not isinstance(args[1], torch.Tensor):
            what = _FROM_HOST_DATA
        if what:
            self.reads.record(what)
        return func(*args, **kwargs)
