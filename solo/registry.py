"""One registry per kind of thing (methods, losses, datasets, optimizers, loggers), filled by a decorator.

    @METHODS.register("simclr", schema=SimCLRConfig)
    class SimCLR(Method): ...

    METHODS["simclr"].target   # the class;  METHODS["simclr"].schema  # what else it was registered with

An entry keeps its implementation and its description (config schema, statistics, ...) together, so
adding a thing is one decorator in one file; an unknown name is an error that lists the known ones.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Iterator

from solo.errors import ConfigError


class Registry:
    def __init__(self, kind: str, key: str):
        self.kind = kind  # "method", "dataset", ...: for error messages
        self.key = key  # the config key that names an entry, e.g. "method.name"
        self._entries: dict[str, SimpleNamespace] = {}

    def register(self, name: str, **info) -> Callable:
        """Decorator: add `target` under `name`, with `info` as attributes of its entry."""

        def add(target):
            if name in self._entries and self._entries[name].target is not target:
                raise ValueError(f"{self.kind} {name!r} is registered twice: {self._entries[name].target} and {target}")
            self._entries[name] = SimpleNamespace(name=name, target=target, **info)
            return target

        return add

    def __getitem__(self, name: str) -> SimpleNamespace:
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} {self.key}={name!r}; available: {', '.join(self.names())}")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[SimpleNamespace]:
        return iter(self._entries.values())

    def names(self) -> list[str]:
        return sorted(self._entries)
