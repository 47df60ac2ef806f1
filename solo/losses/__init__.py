"""Pure, distributed-aware loss functions: in a process group each computes the loss of the global batch.

Every module of this package is imported here, which registers the losses `python -m solo.losses.check` verifies
(LOSSES), and the names each lists in its `__all__` are offered here (`from solo.losses import dino_loss`): a new
loss is one new file and no list to edit."""

from solo.losses._checks import NonFiniteError
from solo.losses.checked import LOSSES
from solo.registry import import_modules

__all__ = ["LOSSES", "NonFiniteError"]
for _module in import_modules(__name__, __path__, skip=("check",)):  # check: the checker's command (python -m)
    globals().update({name: getattr(_module, name) for name in getattr(_module, "__all__", ())})
    __all__ += getattr(_module, "__all__", [])
