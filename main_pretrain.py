"""Pretrain a backbone: `torchrun --nproc_per_node=N main_pretrain.py method=simclr [key=value ...]`."""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from solo.cli import friendly_errors, import_command_line_modules
from solo.config import register_configs
from solo.train.trainer import pretrain

register_configs()
import_command_line_modules(sys.argv)  # so that --help lists what they register


@hydra.main(config_path="configs", config_name="pretrain", version_base="1.3")
@friendly_errors
def main(cfg: DictConfig) -> None:
    pretrain(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
