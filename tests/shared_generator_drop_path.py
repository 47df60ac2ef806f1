"""The known-wrong stochastic depth, for tests/test_strategies.py: timm's own drop_path, drawing each row's mask from
torch's generator in the order of the rows the process holds (what a model keeps when its DropPath is not replaced).
Registered as backbone.name=test_vit_shared_drop_path by `imports=[tests.shared_generator_drop_path]`."""

import torch.nn as nn
from timm.layers import DropPath, drop_path

from solo.backbones import TimmBackboneConfig, create_backbone, register_backbone


class SharedGeneratorDropPath(nn.Module):
    def __init__(self, drop_prob: float):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)


@register_backbone("test_vit_shared_drop_path", schema=TimmBackboneConfig)
def test_vit_shared_drop_path(cfg):
    model, width = create_backbone("test_vit", drop_path_rate=cfg["drop_path_rate"], **cfg.get("kwargs", {}))
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, DropPath):
                setattr(module, name, SharedGeneratorDropPath(child.drop_prob))
    return model, width
