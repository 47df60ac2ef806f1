"""Evaluate pretrained weights: `python main_linear.py pretrained=<zoo name | file | run dir> [data=...]`.

Linear and k-NN classification on frozen cached features (zero-shot too for CLIP), optional full
fine-tuning (finetune.enabled=true); results in <run dir>/metrics.jsonl and summary.json.
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from solo.cli import friendly_errors, import_command_line_modules
from solo.config import register_configs
from solo.evaluate.offline import evaluate_pretrained

register_configs()
import_command_line_modules(sys.argv)  # so that --help lists what they register


@hydra.main(config_path="configs", config_name="linear", version_base="1.3")
@friendly_errors
def main(cfg: DictConfig) -> None:
    evaluate_pretrained(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
