"""Where metrics go: metrics.jsonl in the run directory (always) and Weights & Biases (logger=wandb)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


class MetricsLogger:
    """Rank 0 only. One JSON object per event in <run dir>/metrics.jsonl."""

    def __init__(self, run_dir: Path, cfg, config_dict: dict, resume_step: int | None):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is None:
            self.path.unlink(missing_ok=True)
        else:
            self._truncate_after(resume_step)
        self.wandb = _start_wandb(run_dir, cfg, config_dict) if cfg.name == "wandb" else None

    def _truncate_after(self, step: int) -> None:
        # Events logged after the checkpoint we resume from will be logged again: drop them.
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def log(self, metrics: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def _start_wandb(run_dir: Path, cfg, config_dict: dict):
    import wandb

    # The run id lives in the run directory, so a resumed (or requeued) job continues the same wandb run.
    id_file = run_dir / "wandb_run_id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:16])
    mode = cfg.mode
    if mode == "auto":
        mode = "online" if os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").exists() else "offline"
    return wandb.init(
        project=cfg.project,
        entity=cfg.entity,
        id=id_file.read_text().strip(),
        resume="allow",
        dir=str(run_dir),
        config=config_dict,
        mode=mode,
    )
