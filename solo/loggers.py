"""Where metrics go: metrics.jsonl in the run directory (always), and the configured logger (`logger=`)."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from solo.errors import require
from solo.registry import Registry
from solo.schema import choices

# Each entry: a MetricsLogger class built as `cls(run_dir, logger config, config as a dict, resume_step)`.
LOGGERS = Registry("logger", "logger.name", group="logger")

# auto: online with credentials, else offline.
WandbMode = choices("WandbMode", "auto", "online", "offline")


@dataclass
class LoggerConfig:
    name: str = "jsonl"  # a registered logger: jsonl | wandb (metrics.jsonl is always written)


@dataclass
class WandbConfig(LoggerConfig):
    project: str = "solo"
    entity: Optional[str] = None
    mode: WandbMode = WandbMode("auto")


class MetricsLogger:
    """Rank 0 only. `log` takes one event: a dict with "step" and scalar metrics."""

    def log(self, metrics: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


@LOGGERS.register("jsonl", schema=LoggerConfig)
class JsonlLogger(MetricsLogger):
    """One JSON object per event in <run dir>/metrics.jsonl, with the wall-clock `time` it was logged."""

    def __init__(self, run_dir: Path, cfg=None, config: dict | None = None, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is None:
            self.path.unlink(missing_ok=True)
        else:
            self._truncate_after(resume_step)

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
            f.write(json.dumps(metrics | {"time": round(time.time(), 3)}) + "\n")


@LOGGERS.register("wandb", schema=WandbConfig)
class WandbLogger(MetricsLogger):
    """A Weights & Biases run whose id lives in the run directory, so a resumed (or requeued) job continues it."""

    def __init__(self, run_dir: Path, cfg, config: dict, resume_step: int | None = None):
        wandb = require("wandb", "logger=wandb", "wandb")

        id_file = Path(run_dir) / "wandb_run_id"
        if not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:16])
        mode = str(cfg.mode)
        if cfg.mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").exists() else "offline"
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            id=id_file.read_text().strip(),
            resume="allow",
            dir=str(run_dir),
            config=config,
            mode=mode,
        )

    def log(self, metrics: dict) -> None:
        self.run.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])

    def close(self) -> None:
        self.run.finish()


class Loggers(MetricsLogger):
    """metrics.jsonl plus the configured logger, as one."""

    def __init__(self, run_dir: Path, cfg, config: dict, resume_step: int | None):
        self.loggers = [JsonlLogger(run_dir, cfg, config, resume_step)]
        if cfg.name != "jsonl":
            self.loggers.append(LOGGERS[cfg.name].target(run_dir, cfg, config, resume_step))

    def log(self, metrics: dict) -> None:
        for logger in self.loggers:
            logger.log(metrics)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
