"""Evaluate pretrained weights: `python main_linear.py pretrained=<zoo name | file | run dir> [data=...]`.

Linear and k-NN classification on frozen cached features (zero-shot too for CLIP), optional full
fine-tuning (finetune.enabled=true); results in <run dir>/metrics.jsonl and summary.json. The same as `solo-linear`.
"""

from solo.cli import linear_main

if __name__ == "__main__":
    linear_main()
