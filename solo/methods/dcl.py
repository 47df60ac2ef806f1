"""DCL (Yeh et al., 2022): SimCLR's two views and projector, NT-Xent with the positive out of the denominator over the
global batch; `method.weight_fn=vmf` weights the positive term by the negative von Mises-Fisher weight (DCLW); optionally CO2's
consistency term (Wei et al., 2021) with the global batch's other samples as the negatives."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import dcl_loss
from solo.methods.base import CO2Option, DSEOption, KoLeoOption, TwoViewMethod, co2_term, mlp, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, choices, ruled

# The positive term's weight: none (DCL) or the negative von Mises-Fisher weight over the global batch (DCLW).
WeightFn = choices("WeightFn", "none", "vmf")


@dataclass
class DCLConfig(CO2Option, DSEOption, KoLeoOption):
    name: str = "dcl"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    temperature: float = ruled(0.1, POSITIVE)
    weight_fn: WeightFn = WeightFn("none")  # vmf: DCLW
    sigma: float = ruled(0.5, POSITIVE)  # DCLW's weight: 2 - N softmax(<u1, u2> / sigma) over the global batch


@register_method("dcl", schema=DCLConfig)
class DCL(TwoViewMethod):
    def __init__(self, backbone, feature_dim: int, cfg: DCLConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.temperature = cfg.temperature
        self.sigma = cfg.sigma if cfg.weight_fn == "vmf" else None
        self.cfg = cfg

    def loss(self, z1, z2):
        loss = dcl_loss(z1, z2, self.temperature, self.sigma)
        return loss + co2_term(z1, z2, self.cfg) if self.cfg.co2_weight else loss
