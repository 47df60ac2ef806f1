"""The entry points (`solo-pretrain` = `main_pretrain.py` = `python -m solo`, `solo-linear` = `main_linear.py`) and
what they share: solo's own errors, and Hydra's composition errors, as one message, not a traceback wall.

Before Hydra runs the job, the command line's config is composed with Hydra's compose API and validated (`precheck`):
an unknown option, key, type or value is reported there as `error: <key>=<value>: ...` (exit status 2, rank 0 only),
with a did-you-mean where a name is close. `solo-pretrain --nproc_per_node=N ...` validates the same way once, then
starts the workers through torchrun's Python API (solo.launch)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import re
import shlex
import sys
import time
from typing import Callable

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from solo.config import (
    LinearEvalConfig,
    PretrainConfig,
    check_required,
    import_modules,
    registered_groups,
    validate_linear,
    validate_pretrain,
)
from solo.data.decode import ImageReadError
from solo.errors import ConfigError, SoloError
from solo.schema import unknown_key_hint

WORKER_TRACEBACK = "Original Traceback (most recent call last):"
# After an image that cannot be read: what to do about it.
UNREADABLE_HINT = ". Fix or remove the file, or set data.on_bad_image=skip to leave unreadable images out"
REPORT_GRACE_S = 30  # the longest that ranks > 0 wait under torchrun for rank 0 to report an error


def user_message(error: BaseException) -> str:
    """The error's own message; for one re-raised from a DataLoader worker, the worker's last line."""
    message = str(error).strip()
    if WORKER_TRACEBACK in message:  # torch re-raises worker errors with the worker's traceback inside
        message = message.splitlines()[-1].split(": ", 1)[-1]
    return message


def debugging() -> bool:
    return os.environ.get("SOLO_DEBUG") == "1" or os.environ.get("HYDRA_FULL_ERROR") == "1"


def friendly_errors(main):
    """Decorator for an entry point: a SoloError (or a config error) prints `error: <message>` on rank 0 and
    exits with status 2 (130 when the user stopped the run: Interrupted); SOLO_DEBUG=1 (or HYDRA_FULL_ERROR=1)
    shows the whole traceback instead."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except (SoloError, OmegaConfBaseException) as e:
            if debugging():
                raise
            if os.environ.get("RANK", "0") == "0":
                report(f"error: {user_message(e)}" + (UNREADABLE_HINT if isinstance(e, ImageReadError) else ""))
                print("(SOLO_DEBUG=1 shows the traceback)", file=sys.stderr)
            elif "TORCHELASTIC_RUN_ID" in os.environ:
                # Rank 0 says why. Under torchrun, the first process to exit has the others stopped: wait for
                # rank 0 to print and exit (torchrun then stops this one), lest this one stop it first.
                time.sleep(REPORT_GRACE_S)
            sys.exit(getattr(e, "exit_status", 2))

    return run


def report(message: str) -> None:
    """`message` on stderr, on a line of its own below a progress bar, and in the run's log file (Hydra's
    <run dir>/<job name>.log) where there is one."""
    tqdm.write(message, file=sys.stderr)
    record = logging.LogRecord("solo", logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


class ProgressBarSafeHandler(logging.StreamHandler):
    """Console log lines written with tqdm.write: on a line of their own, the progress bar redrawn below."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)


def import_command_line_modules(argv: list[str]) -> None:
    """Import the modules of an `imports=[...]` override on the command line before Hydra starts, so that what they
    register (methods, datasets, backbones, ...) is listed by --help."""
    given = [arg for arg in argv[1:] if arg.startswith("imports=")]
    for override in friendly_errors(parsed_overrides)(given):
        value = override.value()
        friendly_errors(import_modules)(value if isinstance(value, list) else [value])


# ---------------------------------------------------------------------------------------------------------------------
# Composition, and Hydra's errors as solo's


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    config_name: str  # solo/configs/<config_name>.yaml
    schema: type  # the config's top-level schema
    validate: Callable[[DictConfig], object]  # raises ConfigError


def _validate_pretrain(cfg: DictConfig) -> None:
    check_required(validate_pretrain(cfg))


def _validate_linear(cfg: DictConfig) -> None:
    check_required(validate_linear(cfg))


PRETRAIN = EntryPoint("pretrain", PretrainConfig, _validate_pretrain)
LINEAR = EntryPoint("linear", LinearEvalConfig, _validate_linear)


def parsed_overrides(overrides: list[str]) -> list:
    """Hydra's parse of each override; one it cannot parse is a ConfigError that shows how to quote it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:
        raise ConfigError(unparsable(e.override, e.message)) from e


def unparsable(override: str, message: str) -> str:
    key, _, value = override.partition("=")
    escaped = re.sub(r'\\+(?="|$)', lambda m: m.group(0) * 2, value).replace('"', '\\"')  # as Hydra unescapes
    quoted = shlex.quote(key + '="' + escaped + '"')
    return (
        f"{override}: Hydra cannot parse this ({message.splitlines()[0]}); a value with {{ }} [ ] ( ) , = ' \" or "
        f"spaces needs Hydra's quotes inside the shell's: {quoted}"
    )


def compose(entry: EntryPoint, overrides: list[str]) -> tuple[DictConfig, dict]:
    """(the config `overrides` compose to, without its `hydra` node; Hydra's choices of the config groups), as
    main_pretrain.py / main_linear.py compose it. Raises Hydra's and OmegaConf's errors as they are."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module("solo.configs", version_base="1.3"):
        cfg = hydra_compose(entry.config_name, overrides=overrides, return_hydra_config=True)
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def group_options(group: str) -> list[str]:
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_module("solo.configs", version_base="1.3"):
        return GlobalHydra.instance().config_loader().get_group_options(group)


def composed(entry: EntryPoint, overrides: list[str]) -> tuple[DictConfig, dict]:
    """`compose`, with Hydra's and OmegaConf's errors raised as a ConfigError that names the override."""
    from hydra.errors import HydraException

    parsed = parsed_overrides(overrides)
    try:
        return compose(entry, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_error(e, entry, parsed)) from e


def did_you_mean(name: str, names, prefix: str = "") -> str:
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def given(parsed: list, key: str) -> str | None:
    """The command line's override of `key` (a config key or group) as typed."""
    return next((o.input_line for o in parsed if o.key_or_group == key), None)


# OmegaConf's messages for a value of the wrong type, and what the value must be instead.
VALUE_RULES = (
    (r"could not be converted to Integer", "must be an integer"),
    (r"could not be converted to Float", "must be a number"),
    (r"is not a valid bool", "must be true or false"),
    (r"Cannot convert '.*' to string", "must be a string"),
)
CHOICE = re.compile(r"Invalid value '(.*)', expected one of \[(.*)\]")  # a Choice (solo.schema) or another enum


def hydra_error(error: Exception, entry: EntryPoint, parsed: list) -> str:
    """One line for Hydra's (or OmegaConf's) composition error: the override as given, what is wrong, and a
    did-you-mean where a name is close."""
    from hydra.errors import MissingConfigException

    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        return missing_option(error, parsed)
    missing_view = next(
        filter(None, (no_such_view(o, entry, parsed) for o in parsed if VIEW_KEY.match(o.key_or_group))), None
    )
    if missing_view:
        return missing_view
    cause = error.__cause__ if isinstance(error.__cause__, OmegaConfBaseException) else error
    full_key = getattr(cause, "full_key", None)
    message = getattr(cause, "msg", None) or str(cause)
    if full_key and str(error).startswith("Could not override"):
        return unknown_key(full_key, given(parsed, full_key) or full_key, entry, parsed)
    if full_key and str(error).startswith("Error merging override"):
        override = given(parsed, full_key) or str(error).removeprefix("Error merging override ")
        choice = CHOICE.search(message)
        if choice:
            allowed = choice.group(2).split(", ")
            return f"{override}: must be one of {', '.join(allowed)}{did_you_mean(choice.group(1), allowed)}"
        rule = next((rule for pattern, rule in VALUE_RULES if re.search(pattern, message)), one_line(message))
        return f"{override}: {rule}"
    text = one_line(f"{error}\n{error.__cause__ or ''}")
    named = next((o.input_line for o in parsed if f"'{o.key_or_group}'" in text), None)  # the override it names
    return f"{named}: {text}" if named else text


VIEW_KEY = re.compile(r"augmentation\.views\.(\d+)\.")  # one view's key, by its index


def no_such_view(view, entry: EntryPoint, parsed: list) -> str | None:
    """Where the augmentation chosen has no view of the index that `view` (an override of one view's key) names, why.
    Under augmentation=auto (the default) no view is written out: the method picks its recipe when the run starts."""
    index = int(VIEW_KEY.match(view.key_or_group).group(1))
    cfg, _ = compose(entry, [o.input_line for o in parsed if o is not view])
    name, count = cfg.augmentation.name, len(cfg.augmentation.views)
    if count == 0:
        return (
            f"{view.input_line}: augmentation={name} writes no views out to change (the method picks its recipe when "
            f"the run starts; the run's first lines name it): choose the recipe and change its view, e.g. "
            f"augmentation=simclr {view.input_line}, or write the views out (augmentation.views=[...])"
        )
    if index >= count:
        return f"{view.input_line}: augmentation={name} has {count} views (indices 0 to {count - 1}); there is no view {index}"
    return None


def one_line(message: str) -> str:
    """Hydra's and OmegaConf's message on one line, without their notes for the developer."""
    noise = re.compile(r"\s*(full_key|reference_type|object_type|See https://hydra|Config search path|provider=)")
    lines = [line.strip() for line in message.splitlines() if line.strip() and not noise.match(line)]
    return " ".join(lines)


def missing_option(error, parsed: list) -> str:
    group, _, option = error.missing_cfg_file.rpartition("/")
    if not group:  # the primary config (--config-name)
        return f"--config-name={option}: there is no config {option} in solo/configs"
    options = list(error.options or [])
    text = f"{given(parsed, group) or f'{group}={option}'}: {group} has no option {option}"
    if not options:
        return f"{text}: no config group is named {group}"
    return f"{text}{did_you_mean(option, options, f'{group}=')} (the options: {', '.join(options)})"


def unknown_key(key: str, override: str, entry: EntryPoint, parsed: list, composition=None) -> str:
    """`override` names a key its node does not have: the node's keys, and where a group's option is chosen there,
    the group's options that have the key (rather than Hydra's advice, `+key=...`, which adds a key that the option's
    schema still rejects). `composition`: (cfg, choices) of the config; by default composed without `override`."""
    parent, _, name = key.rpartition(".")
    if not parent:
        keys = schema_keys(entry.schema)
        return (
            f"{override}: the config has no key {name}{did_you_mean(name, keys)} (its keys: {', '.join(keys)})"
            + unknown_key_hint(key)
        )
    if composition is None:
        try:
            composition = compose(entry, [o.input_line for o in parsed if o.input_line != override])
        except Exception:  # another override is wrong too: it is reported once this one is fixed
            composition = (None, {})
    cfg, choices = composition
    registry, option = registered_groups().get(parent), choices.get(parent)
    if registry is not None and option in registry:
        keys = schema_keys(registry[option].schema)
        having = [o for o in group_options(parent) if o in registry and name in schema_keys(registry[o].schema)]
        where = f"the {parent} options with {name}: {', '.join(having)}" if having else f"no {parent} option has {name}"
        close = did_you_mean(name, keys, f"{parent}.")
        return f"{override}: {parent}={option} has no key {name}{close} (its keys: {', '.join(keys)}); {where}"
    node = OmegaConf.select(cfg, parent, default=None) if cfg is not None else None
    keys = [k for k in node.keys() if k != name] if isinstance(node, DictConfig) else []
    text = f"{override}: {parent} has no key {name}{did_you_mean(name, keys, f'{parent}.')}"
    return (f"{text} (its keys: {', '.join(keys)})" if keys else text) + unknown_key_hint(key)


def schema_keys(schema) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else []


def check_added_keys(cfg: DictConfig, choices: dict, entry: EntryPoint, parsed: list) -> None:
    """A key added with `+` that the schema of its node does not have: at the top, or in a registered group's option
    (the schemas check deeper keys when the config is validated)."""
    for override in parsed:
        key = override.key_or_group
        if not override.is_add() or key in choices:  # `+group=option` adds a config group's option
            continue
        parent, _, name = key.rpartition(".")
        registry, option = registered_groups().get(parent), choices.get(parent)
        unknown_at_top = not parent and name not in schema_keys(entry.schema)
        if unknown_at_top or (
            registry is not None and option in registry and name not in schema_keys(registry[option].schema)
        ):
            raise ConfigError(unknown_key(key, override.input_line, entry, parsed, (cfg, choices)))


def precheck(entry: EntryPoint, argv: list[str]) -> None:
    """Compose the config of the command line `argv` (Hydra's flags and overrides) and validate it, before Hydra
    runs the job: errors as ConfigError. --help, --cfg and --info are checked for composition only; multirun (its
    sweeps), --config-path and --config-dir are left to Hydra."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    skip = args.multirun or args.shell_completion or args.hydra_help or args.config_path or args.config_dir
    if skip or args.experimental_rerun:
        return
    parsed = parsed_overrides(args.overrides)
    if any(o.is_sweep_override() or o.input_line == "hydra.mode=MULTIRUN" for o in parsed):
        return
    if args.config_name:
        entry = dataclasses.replace(entry, config_name=args.config_name)
    cfg, choices = composed(entry, args.overrides)
    if args.help or args.cfg or args.info:
        return
    check_added_keys(cfg, choices, entry, parsed)
    entry.validate(cfg)


def _hydra_entry_point(entry: EntryPoint, run) -> None:
    """Compose `solo/configs/<config_name>.yaml` with the command line and call `run(cfg, run_dir)`."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from solo.config import register_configs

    register_configs()
    import_command_line_modules(sys.argv)  # so that --help lists what they register
    friendly_errors(precheck)(entry, sys.argv[1:])

    @hydra.main(config_path="configs", config_name=entry.config_name, version_base="1.3")
    @friendly_errors
    def main(cfg) -> None:
        run(cfg, HydraConfig.get().runtime.output_dir)

    main()


def pretrain_main() -> None:
    """Pretrain a backbone: `torchrun --nproc_per_node=N main_pretrain.py method=simclr [key=value ...]`, or
    `solo-pretrain --nproc_per_node=N method=simclr [key=value ...]`, which validates the config once, then starts the
    workers (torchrun's --nnodes, --node_rank, --master_addr, --master_port, --rdzv_* and --standalone are passed on)."""
    from solo.launch import die_with_launcher, launch, split_launcher_args

    die_with_launcher()  # first: a worker whose launcher dies while it imports stops too
    launcher, argv = friendly_errors(split_launcher_args)(sys.argv[1:])
    if launcher and not shows_only(argv):
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a worker of torchrun: one launch is enough
            friendly_errors(raise_config_error)(
                f"{launcher[0]}: this process is already a worker of torchrun: give torchrun's flags to torchrun, "
                "before the script's name, or run solo-pretrain with them without torchrun"
            )
        from solo.config import register_configs

        register_configs()
        import_command_line_modules([sys.argv[0], *argv])
        friendly_errors(precheck)(PRETRAIN, argv)
        launch(launcher, argv)
        return
    sys.argv[1:] = argv  # --help, --cfg, --info: shown by this process
    from solo.train.trainer import pretrain

    _hydra_entry_point(PRETRAIN, pretrain)


def shows_only(argv: list[str]) -> bool:
    """Whether Hydra's flags in `argv` ask to show something (help, the config, info) rather than to run."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion)


def raise_config_error(message: str) -> None:
    raise ConfigError(message)


def linear_main() -> None:
    """Evaluate pretrained weights: `python main_linear.py pretrained=<zoo name | file | run dir> [data=...]`."""
    from solo.launch import die_with_launcher

    die_with_launcher()
    from solo.downstream.offline import evaluate_pretrained

    _hydra_entry_point(LINEAR, evaluate_pretrained)
