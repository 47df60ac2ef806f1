"""LOSSES: the losses that `python -m solo.losses.check` verifies, each registered next to its loss as a
function `(z1, z2, **learnable) -> scalar`; `learnable` (name -> initial value) lists the scalar parameters
the checker makes learnable and passes by keyword."""

from solo.registry import Registry

LOSSES = Registry("loss", "loss")
