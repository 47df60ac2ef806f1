"""One registry per kind of thing (methods, datasets, backbones, optimizers, loggers, losses), filled by a decorator.

    @METHODS.register("simclr", schema=SimCLRConfig)
    class SimCLR(Method): ...

    METHODS["simclr"].target   # the class;  METHODS["simclr"].schema  # its typed config (a dataclass)

An entry pairs its implementation with its typed config, so adding a thing is one decorator in one file.
A registry whose kind is a config group (`group`: the `method`, `data`, `backbone`, `optim` and `logger`
groups) also stores each entry's schema for Hydra as `/schema/<group>/<name>`: a YAML option of the group
lists it in its defaults and is typed while the config is composed. An unknown name is an error that lists
the known ones.

A package of such files (solo.methods, solo.losses) imports every module it holds (`import_modules`): adding a
method or a loss is one new file and no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType, SimpleNamespace
from typing import Callable, Iterable, Iterator

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from solo.errors import ConfigError
from solo.schema import check_values


class Registry:
    def __init__(self, kind: str, key: str, *, group: str | None = None):
        self.kind = kind  # "method", "dataset", ...: for error messages
        self.key = key  # the config key that names an entry, e.g. "data.name"
        self.group = group  # the config group an entry's schema types, e.g. "data"; None: not a config group
        self._entries: dict[str, SimpleNamespace] = {}
        self._fallback: SimpleNamespace | None = None

    def register(self, name: str, *, schema: type | None = None, **info) -> Callable:
        """Decorator: add `target` under `name`, with its config `schema` and `info` as attributes of its entry."""

        def add(target):
            if name in self._entries and self._entries[name].target is not target:
                raise ValueError(f"{self.kind} {name!r} is registered twice: {self._entries[name].target} and {target}")
            self._entries[name] = SimpleNamespace(name=name, target=target, schema=schema, **info)
            if self.group and schema is not None:
                ConfigStore.instance().store(group=f"schema/{self.group}", name=name, node=schema)
            return target

        return add

    def register_fallback(self, description: str, *, schema: type, **info) -> Callable:
        """Decorator: the entry for every name that is not registered (timm's models, for backbones): its target
        gets the name and raises ConfigError when the name means nothing to it either."""

        def add(target):
            self._fallback = SimpleNamespace(name=description, target=target, schema=schema, **info)
            if self.group:
                ConfigStore.instance().store(group=f"schema/{self.group}", name="default", node=schema)
            return target

        return add

    def __getitem__(self, name: str) -> SimpleNamespace:
        if name in self._entries:
            return self._entries[name]
        if self._fallback is not None:
            return self._fallback
        raise ConfigError(f"unknown {self.kind} {self.key}={name!r}; available: {', '.join(self.names())}")

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[SimpleNamespace]:
        return iter(self._entries.values())

    def config(self, name: str, **keys) -> DictConfig:
        """The typed config of entry `name` with `keys` set and its schema's defaults for the rest, every value
        checked: to build a thing in code as a config file would (a key the entry does not take is an error)."""
        cfg = OmegaConf.merge(OmegaConf.structured(self[name].schema), {"name": name, **keys})
        check_values(cfg, self.group or self.kind)
        return cfg

    def names(self) -> list[str]:
        return sorted(self._entries)

    def describe(self) -> str:
        """One line for --help: the kind and its registered names (and what else it takes)."""
        listed = self.names() + ([self._fallback.name] if self._fallback else [])
        return f"{self.key}: {', '.join(listed)}"


def import_modules(package: str, path: Iterable[str], skip: tuple[str, ...] = ()) -> list[ModuleType]:
    """Every module of `package` (its `__path__`), imported in name order but those in `skip`: their decorators
    fill the registries."""
    names = sorted(m.name for m in pkgutil.iter_modules(path) if m.name not in skip)
    return [importlib.import_module(f"{package}.{name}") for name in names]
