"""solo's own error types: the entry points print their message alone, without a traceback."""


class SoloError(Exception):
    """An error the user can act on; its message says what was wrong and what to do."""

    exit_status = 2


class Interrupted(SoloError):
    """The user stopped the run at once (a second Ctrl-C); the message says what was saved."""

    exit_status = 130  # a shell's status for a process that SIGINT stopped


class ConfigError(SoloError, ValueError):
    """A configuration value, key or combination that cannot work."""


class NotFound(SoloError, FileNotFoundError):
    """A file or folder that the configuration names does not exist."""


class DataError(SoloError, ValueError):
    """Data that exists but cannot be used: wrong columns, empty captions, too few samples."""


class CheckpointError(SoloError, RuntimeError):
    """A checkpoint that cannot be resumed from in this run."""


class TrainingDiverged(SoloError, RuntimeError):
    """The loss or the features became non-finite; no checkpoint of that step was written."""


def require(module: str, needed_by: str, extra: str):
    """Import the optional package `module`, or raise ConfigError naming what needs it and the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{needed_by} needs the {module} package: pip install 'solo[{extra}]'") from None
