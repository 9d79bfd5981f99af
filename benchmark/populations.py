"""Named model populations behind the papers' tables (package data ``populations.yaml``).

    >>> get_population("lance-table2").paper_names()
    ['ResNet-50', 'ViT-B', 'ConvNext']
    >>> list_populations()
    ['imagenet-star-61', 'in-g-fig4', 'lance-table2']

A population is data, registered like the suites: a full timm ``arch.tag`` per model, the name the
paper uses, where the entry comes from, and why this tag where the paper names no weights.
``bench eval --models <population>`` scores its public models; entries the authors trained
themselves (``checkpoint: local``, e.g. IN-G's same-recipe replicas RN2 / VIT2) need the user's
own weights (``bench eval --model <arch>=<file>``) and are left out of the list with a log line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from genshift.identity import timm_name as model_key
from genshift.registry import Registry

log = logging.getLogger(__name__)

ROLES = ("model", "target", "replica", "in21k")
_ENTRY_KEYS = {"model", "paper", "role", "suite", "replica_of", "checkpoint"}


@dataclass(frozen=True)
class Member:
    """One model of a population."""

    model: str                    # timm arch.tag (arch only for a local-checkpoint replica)
    paper: str                    # the paper's name for it
    role: str = "model"           # model | target | replica | in21k
    suite: str | None = None      # a target: the suite it mined
    replica_of: str | None = None
    checkpoint: str | None = None  # "local": no public weights, the user scores their own checkpoint

    @property
    def local(self) -> bool:
        return self.checkpoint == "local"


@dataclass(frozen=True)
class Population:
    name: str
    title: str
    source: str
    suites: tuple[str, ...]
    choice: str
    members: tuple[Member, ...]

    def paper_names(self) -> list[str]:
        return [m.paper for m in self.members]

    def public(self) -> list[Member]:
        return [m for m in self.members if not m.local]

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "source": self.source, "suites": list(self.suites),
                "choice": self.choice, "models": [{k: v for k, v in m.__dict__.items() if v is not None}
                                                  for m in self.members]}


def _parse(rows: list[dict]) -> list[Population]:
    out = []
    for row in rows:
        members = []
        for e in row["models"]:
            extra = set(e) - _ENTRY_KEYS
            if extra or e.get("role", "model") not in ROLES or e.get("checkpoint") not in (None, "local"):
                raise ValueError(f"population {row['name']}: bad entry {e!r}")
            members.append(Member(**e))
        keys = [model_key(m.model) for m in members if not m.local]
        if len(set(keys)) != len(keys):
            raise ValueError(f"population {row['name']} lists a model twice")
        out.append(Population(name=row["name"], title=row["title"], source=row["source"],
                              suites=tuple(row["suites"]), choice=" ".join(row["choice"].split()),
                              members=tuple(members)))
    return out


@lru_cache(maxsize=1)
def _registry() -> Registry[Population]:
    reg: Registry[Population] = Registry("population")
    text = resources.files("genshift").joinpath("_data", "populations.yaml").read_text()
    for pop in _parse(yaml.safe_load(text)):
        reg.register(pop.name, pop)
    reg.freeze()
    return reg


def get_population(name: str) -> Population:
    """The population ``name`` (an unknown name gets a 'did you mean')."""
    return _registry().get(name)


def list_populations(pattern: str = "*") -> list[str]:
    return _registry().names(pattern)


def is_population(name: str) -> bool:
    return name in _registry()


def population_models(name: str) -> list[tuple[str, None]]:
    """``bench eval --models <population>``: (timm name, no checkpoint) for each public model; each
    local-checkpoint replica is logged with the command that scores it."""
    pop = get_population(name)
    for m in pop.members:
        if m.local:
            log.info("%s: %s (%s) has no public weights; score your own checkpoint with "
                     "`bench eval --model %s=<file>`", name, m.paper, m.role, m.model)
    return [(m.model, None) for m in pop.public()]
