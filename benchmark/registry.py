"""One registry type for every pluggable kind, modelled on lm-evaluation-harness's ``Registry``: a duplicate name is an
error (never a silent overwrite), a registry can be frozen, an unknown name gets close matches."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from importlib import resources
from typing import Generic, TypeVar

import yaml

from genshift.errors import unknown

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object map with strict registration; ``kind`` names the entries in errors ("suite", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._frozen = False

    def register(self, name: str, obj: T) -> T:
        if self._frozen:
            raise RuntimeError(f"the {self.kind} registry is frozen; cannot register {name!r}")
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj
        return obj

    def freeze(self) -> None:
        self._frozen = True

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise unknown(self.kind, name, self._items) from None

    def names(self, pattern: str = "*") -> list[str]:
        """Registered names matching a shell wildcard, sorted."""
        return sorted(n for n in self._items if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def package_yaml(name: str):
    """A YAML file of the package data (``benchmark/_data/<name>``): the registries' specs."""
    return yaml.safe_load(resources.files("genshift").joinpath("_data", name).read_text())
