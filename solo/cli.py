"""What the entry points share: solo's own errors as one message, not a traceback wall."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path

from tqdm import tqdm

from omegaconf.errors import OmegaConfBaseException

from solo.errors import SoloError

WORKER_TRACEBACK = "Original Traceback (most recent call last):"


def user_message(error: BaseException) -> str:
    """The error's own message; for one re-raised from a DataLoader worker, the worker's last line."""
    message = str(error).strip()
    if WORKER_TRACEBACK in message:  # torch re-raises worker errors with the worker's traceback inside
        message = message.splitlines()[-1].split(": ", 1)[-1]
    return message


def friendly_errors(main):
    """Decorator for an entry point: a SoloError (or a config error) prints `error: <message>` on rank 0 and
    exits with status 2; SOLO_DEBUG=1 (or HYDRA_FULL_ERROR=1) shows the whole traceback instead."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except (SoloError, OmegaConfBaseException) as e:
            if os.environ.get("SOLO_DEBUG") == "1" or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            if os.environ.get("RANK", "0") == "0":
                print(f"error: {user_message(e)}", file=sys.stderr)
                print("(SOLO_DEBUG=1 shows the traceback)", file=sys.stderr)
            sys.exit(2)

    return run


class ProgressBarSafeHandler(logging.StreamHandler):
    """Console log lines written with tqdm.write: on a line of their own, the progress bar redrawn below."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)


def eval_name(pretrained: str, random_init: bool) -> str:
    """A run-directory name for evaluating `pretrained`: a zoo name, or the run (and step) a path points to."""
    path = Path(str(pretrained))
    parts = [path.parent.parent.name, path.stem] if path.parent.name == "checkpoints" else [path.stem if path.suffix else path.name]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(p for p in parts if p))
    return name + ("-random_init" if random_init else "")
