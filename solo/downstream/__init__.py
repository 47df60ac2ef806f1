"""Evaluation drivers (main_linear.py): linear, k-NN and zero-shot on frozen features, and full fine-tuning, built on
the trainer's components; the evaluation primitives they use are in solo.eval."""
