"""What the entry points share: solo's own errors as one message, not a traceback wall."""

from __future__ import annotations

import functools
import logging
import os
import sys

from tqdm import tqdm

from omegaconf.errors import OmegaConfBaseException

from solo.config import import_modules
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


def import_command_line_modules(argv: list[str]) -> None:
    """Import the modules of an `imports=[...]` override on the command line before Hydra starts, so that what they
    register (methods, datasets, backbones, ...) is listed by --help."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [arg for arg in argv[1:] if arg.startswith("imports=")]
    for override in OverridesParser.create().parse_overrides(given):
        value = override.value()
        friendly_errors(import_modules)(value if isinstance(value, list) else [value])
