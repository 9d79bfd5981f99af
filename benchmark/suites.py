"""The suite registry, one frozen ``SuiteSpec`` per suite id looked up like timm models, and the named model
populations behind the papers' tables that score them.

    >>> get_suite("imagenet-star").reference_config
    'base'
    >>> list_suites("in-g-*")
    ['in-g-rn', 'in-g-vit']
    >>> get_population("lance-table2").paper_names()
    ['ResNet-50', 'ViT-B', 'ConvNext']
    >>> list_populations()
    ['imagenet-star-61', 'in-g-fig4', 'lance-table2']

Both are package data. ``_data/suites.yaml``: where each suite lives on the Hub and at which commit, its configs, the
metric family that scores it and the labels that occur in it. ``populations.yaml``: per member a timm ``arch.tag``, the
paper's name, its role (:data:`ROLES`) and, for ImageNet*, the data config the paper's timm resolved
(``imagenet_star_61.yaml``, from ``scripts/pin_imagenet_star.py``); ``docs/reproducing.md`` tells how each population
was chosen and how ``bench eval --models`` scores it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError
from genshift.families import FAMILIES
from genshift.hubio import SHA_RE
from genshift.identity import timm_name
from genshift.registry import Registry, package_yaml

log = logging.getLogger(__name__)
METRIC_FAMILIES = tuple(FAMILIES)  # the registered metric families (genshift.families)

# The 15 Hard ImageNet classes by wnid, in HardImageNet's class order (Moayeri et al. 2022).
HARD_IMAGENET_WNIDS = ("n03218198", "n02492660", "n04162706", "n04228054", "n04356056", "n02807133", "n02777292",
                       "n03535780", "n03899768", "n04019541", "n03770439", "n04264628", "n04540053", "n09835506",
                       "n04251144")


@dataclass(frozen=True)
class Shift:
    key: str
    prompt: str
    group: str
    status: str


@lru_cache(maxsize=1)
def imagenet_star_shifts() -> tuple[Shift, ...]:
    """The ImageNet* prompt table (package data ``imagenet_star_shifts.yaml``)."""
    return tuple(Shift(**row) for row in package_yaml("imagenet_star_shifts.yaml"))


@dataclass(frozen=True)
class SuiteSpec:
    """A registered suite."""

    id: str                               # registry key, e.g. "imagenet-star"
    title: str                            # one line for tables
    repo_id: str                          # the Hub dataset repo holding it in format 1
    revision: str | None                  # a commit sha, or None while unpinned (results are flagged)
    configs: tuple[str, ...]
    metric_family: str                    # a genshift.families name
    reference_config: str | None = None   # the in-distribution config others are compared with
    label_subset: tuple[int, ...] | None = None  # the labels that occur (None: all 1000; scored 1000-way)
    construction_models: tuple[str, ...] = ()    # built, mined or filtered the data: their results are flagged
    source: str = "format1"               # or "upstream-imagenet-star" (the released zips, genshift.upstream)
    paper: str = ""
    version: str = "1.0.0"
    gated: bool = False
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.revision is not None and not SHA_RE.match(self.revision):
            raise ValueError(f"suite {self.id!r}: revision must be a 40-character commit sha or None, "
                             f"got {self.revision!r}")
        if self.metric_family not in METRIC_FAMILIES:
            raise ValueError(f"suite {self.id!r}: unknown metric family {self.metric_family!r}")
        if self.reference_config is not None and self.reference_config not in self.configs:
            raise ValueError(f"suite {self.id!r}: reference config {self.reference_config!r} is not a config")


SUITES: Registry[SuiteSpec] = Registry("suite")


def _register_defaults(reg: Registry[SuiteSpec]) -> None:
    """The specs of package data ``suites.yaml``, in its order; then the registry is frozen."""
    subsets = {"hard_imagenet": lambda: tuple(imagenet.index_of(w) for w in HARD_IMAGENET_WNIDS),
               "imagenet_a": imagenet.imagenet_a_indices}
    for row in package_yaml("suites.yaml"):
        star = row["configs"] == "imagenet_star_shifts"  # the prompt table's keys
        row["configs"] = tuple(s.key for s in imagenet_star_shifts()) if star else tuple(row["configs"])
        if "label_subset" in row:
            row["label_subset"] = subsets[row["label_subset"]]()
        row["construction_models"] = tuple(row.get("construction_models", ()))
        reg.register(row["id"], SuiteSpec(**row))
    reg.freeze()


_register_defaults(SUITES)


def get_suite(suite_id: str) -> SuiteSpec:
    """The registered spec for ``suite_id`` (unknown ids get a 'did you mean')."""
    return SUITES.get(suite_id)


def list_suites(pattern: str = "*") -> list[str]:
    return SUITES.names(pattern)


def declared_scoring(manifest, spec: SuiteSpec | None = None) -> tuple[str, str | None]:
    """Metric family and reference config of a suite: its registry ``spec``'s, else what its manifest's ``generator``
    declares (import-folder does), else accuracy."""
    if spec is not None:
        return spec.metric_family, spec.reference_config
    family = manifest.generator.get("metric_family", "accuracy")  # a dict: the manifest's schema says so
    reference = manifest.generator.get("reference_config")
    if family not in METRIC_FAMILIES or not (reference is None or (isinstance(reference, str)
                                                                   and reference in manifest.configs)):
        raise IntegrityError(f"suite {manifest.suite_id!r} declares metric family {str(family)[:40]!r} with reference "
                             f"config {str(reference)[:70]!r}; expected one of {', '.join(METRIC_FAMILIES)} and one "
                             "of its configs; fix or re-import the suite")
    return family, reference


def construction_models(manifest, spec: SuiteSpec | None) -> tuple[str, ...]:
    """The models that built, mined or filtered a suite, whose results are flagged: the target the build
    recorded (``generator.target``, IN-G's mining classifier; local weights as ``sha256:<hex>``, not their
    architecture), else the registry's ``construction_models`` (the CLIP filters of ImageNet* and LANCE)."""
    target = manifest.generator.get("target")
    if isinstance(target, dict):
        sha, mid = target.get("weights_sha256"), target.get("id")
        if target.get("source") == "checkpoint" and isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
            return (f"sha256:{sha}",)
        declared = target.get("declared_name")  # local weights: the name they were built as
        if isinstance(mid, str) and mid.strip():
            return (timm_name(declared if isinstance(declared, str) and declared.strip() else mid)[:200],)
    return spec.construction_models if spec else ()


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
