"""The suite registry: one frozen ``SuiteSpec`` per suite id, looked up like timm models.

    >>> get_suite("imagenet-star").reference_config
    'base'
    >>> list_suites("in-g-*")
    ['in-g-rn', 'in-g-vit']

The specs are package data (``_data/suites.yaml``): where each suite lives on the Hub and at which
commit, its configs, the metric family that scores it and the labels that occur in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from genshift import imagenet
from genshift.errors import IntegrityError
from genshift.families import FAMILIES
from genshift.hubio import SHA_RE
from genshift.identity import timm_name
from genshift.registry import Registry, package_yaml

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

