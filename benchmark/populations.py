"""Named model populations behind the papers' tables (package data ``populations.yaml``).

    >>> get_population("lance-table2").paper_names()
    ['ResNet-50', 'ViT-B', 'ConvNext']
    >>> list_populations()
    ['imagenet-star-61', 'in-g-fig4', 'lance-table2']

Per member: a timm ``arch.tag``, the paper's name, its role (:data:`ROLES`) and, for ImageNet*, the data
config the paper's timm resolved (``imagenet_star_61.yaml``, from ``scripts/pin_imagenet_star.py``).
``docs/reproducing.md`` tells how each population was chosen and how ``bench eval --models`` scores it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from functools import lru_cache

from genshift.errors import BenchError
from genshift.registry import Registry, package_yaml

log = logging.getLogger(__name__)

ROLES = {"fit": "a point of the ID/OOD fits", "column": "a column of the paper's table",
         "target": "the model the suite was mined against", "in21k": "a model pretrained on ImageNet-21k",
         "replica": "the target's recipe with another seed (no public weights; model = its architecture)"}
CONFIGS = ("paper", "today")  # a member's recorded data config, or today's timm config


@dataclass(frozen=True)
class Member:
    """One model of a population."""

    model: str                      # timm arch.tag (a replica: its architecture)
    paper: str                      # the paper's name for it
    role: str                       # one of ROLES
    suite: str | None = None        # a target: the suite it mined
    replica_of: str | None = None
    data_config: dict | None = None  # the eval data config the paper's timm resolved (None: today's)
    matched_by: str | None = None   # how the tag was matched to the paper's weights
    url: str | None = None          # the weights the paper's timm loaded

    @property
    def local(self) -> bool:
        """No public weights: the user scores their own (``bench reproduce --member``)."""
        return self.role == "replica"


@dataclass(frozen=True)
class Population:
    name: str
    title: str
    source: str
    suites: tuple[str, ...]
    choice: str
    members: tuple[Member, ...]
    data_config_from: str | None = None  # e.g. "timm 0.6.12": where the members' data configs come from

    def paper_names(self) -> list[str]:
        return [m.paper for m in self.members]

    def to_dict(self) -> dict:
        out = {**asdict(self), "suites": list(self.suites)}
        out["models"] = [{k: v for k, v in m.items() if v is not None} for m in out.pop("members")]
        return out


@lru_cache(maxsize=1)
def _registry() -> Registry[Population]:
    reg: Registry[Population] = Registry("population")
    for row in package_yaml("populations.yaml"):
        entries, source = row.get("models"), None
        if "models_file" in row:  # members written by a script, with the paper's data configs
            data = package_yaml(row["models_file"])
            entries, source = data["models"], f"timm {data['timm']}"
        members = tuple(Member(**e) for e in entries)  # an unknown or missing key: TypeError
        if bad := [m for m in members if m.role not in ROLES or not m.model or not m.paper]:
            raise ValueError(f"population {row['name']}: bad member {bad[0]} (needs model, paper and a role of "
                             f"{', '.join(ROLES)})")
        tags = [m.model for m in members if not m.local]
        if len(set(tags)) != len(tags) or len({m.paper for m in members}) != len(members):
            raise ValueError(f"population {row['name']} lists a model twice")
        reg.register(row["name"], Population(name=row["name"], title=row["title"], source=row["source"],
                                             suites=tuple(row["suites"]), choice=" ".join(row["choice"].split()),
                                             members=members, data_config_from=source))
    reg.freeze()
    return reg


def get_population(name: str) -> Population:
    """The population ``name`` (an unknown name gets a 'did you mean')."""
    return _registry().get(name)


def list_populations(pattern: str = "*") -> list[str]:
    return _registry().names(pattern)


def is_population(name: str) -> bool:
    return name in _registry()


def population_models(name: str, *, config: str = "paper") -> list[tuple[str, dict | None, str | None]]:
    """``bench eval --models <population>``: (timm tag, data config, its source) per public member, the
    recorded data config (``config="paper"``) or None (``"today"``: timm's own); replicas are logged."""
    if config not in CONFIGS:
        raise BenchError(f"population config {config!r}: use one of {', '.join(CONFIGS)}")
    pop = get_population(name)
    for m in pop.members:
        if m.local:
            log.info("%s: %s (%s) has no public weights; score your own checkpoint with `bench eval --model "
                     "%s=<file>` and name its result with `bench reproduce --member %s=<model id>`",
                     name, m.paper, m.role, m.model, m.paper)
    today = config == "today" or pop.data_config_from is None
    return [(m.model, None if today else m.data_config, None if today else pop.data_config_from)
            for m in pop.members if not m.local]


def recorded_data_config(model: str, source: str) -> dict:
    """The data config of timm tag ``model`` in the population whose configs come from ``source``."""
    pops = [get_population(name) for name in list_populations()]
    hit = next((m for p in pops if p.data_config_from == source for m in p.members if m.model == model), None)
    if hit is not None:
        return hit.data_config
    raise BenchError(f"no population records a {source} data config for {model!r}; the result's protocol.data_config "
                     "cannot be re-run here")
