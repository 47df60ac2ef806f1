"""The entry points (`solo-pretrain` = `main_pretrain.py`, `solo-linear` = `main_linear.py`) and what they share: solo's
own errors as one message, not a traceback wall."""

from __future__ import annotations

import functools
import logging
import os
import sys

from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

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


def _hydra_entry_point(config_name: str, run) -> None:
    """Compose `solo/configs/<config_name>.yaml` with the command line and call `run(cfg, run_dir)`."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from solo.config import register_configs

    register_configs()
    import_command_line_modules(sys.argv)  # so that --help lists what they register

    @hydra.main(config_path="configs", config_name=config_name, version_base="1.3")
    @friendly_errors
    def main(cfg) -> None:
        run(cfg, HydraConfig.get().runtime.output_dir)

    main()


def pretrain_main() -> None:
    """Pretrain a backbone: `torchrun --nproc_per_node=N main_pretrain.py method=simclr [key=value ...]`."""
    from solo.train.trainer import pretrain

    _hydra_entry_point("pretrain", pretrain)


def linear_main() -> None:
    """Evaluate pretrained weights: `python main_linear.py pretrained=<zoo name | file | run dir> [data=...]`."""
    from solo.evaluate.offline import evaluate_pretrained

    _hydra_entry_point("linear", evaluate_pretrained)
