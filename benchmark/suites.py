"""The suite registry: one frozen ``SuiteSpec`` per suite id, looked up like timm models.

    >>> get_suite("imagenet-star").reference_config
    'base'
    >>> list_suites("in-g-*")
    ['in-g-rn', 'in-g-vit']

A spec says where a suite lives on the Hub and at which commit (``revision`` is a 40-character
sha, or ``None`` = explicitly unpinned until first published), which configs it has, which
metric family scores it and which labels occur in it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from benchmark import imagenet
from benchmark.registry import Registry

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
METRIC_FAMILIES = ("imagenet_star", "lance", "in_g", "accuracy")

# The 15 Hard ImageNet classes by wnid, in HardImageNet's class order (Moayeri et al. 2022).
HARD_IMAGENET_WNIDS = (
    "n03218198", "n02492660", "n04162706", "n04228054", "n04356056", "n02807133", "n02777292",
    "n03535780", "n03899768", "n04019541", "n03770439", "n04264628", "n04540053", "n09835506",
    "n04251144",
)


@dataclass(frozen=True)
class Shift:
    key: str
    prompt: str
    group: str
    status: str


@lru_cache(maxsize=1)
def imagenet_star_shifts() -> tuple[Shift, ...]:
    """The ImageNet* prompt table (package data ``imagenet_star_shifts.yaml``)."""
    text = resources.files("benchmark").joinpath("_data", "imagenet_star_shifts.yaml").read_text()
    return tuple(Shift(**row) for row in yaml.safe_load(text))


@dataclass(frozen=True)
class SuiteSpec:
    """A registered suite.

    Attributes
    ----------
    id : registry key, e.g. ``"imagenet-star"``.
    title : one line for tables.
    repo_id : Hub dataset repo holding the suite in format 1.
    revision : 40-character commit sha, or ``None`` while unpinned (results then record the
        sha resolved at download time and are flagged as unpinned).
    configs : config names (folders under ``data/``).
    metric_family : which metrics ``bench eval`` computes (``eval.metrics`` registry).
    reference_config : in-distribution config other configs are compared with, if any.
    label_subset : ImageNet-1k indices that occur as labels (``None`` = all 1000). Models are
        still scored on the full 1000-way output.
    construction_models : models used to build, mine or filter the data; results of these models
        are flagged (their scores are biased by construction).
    source : ``"format1"`` (our suites) or ``"upstream-imagenet-star"`` (the released zips, read
        through ``benchmark.upstream``).
    """

    id: str
    title: str
    repo_id: str
    revision: str | None
    configs: tuple[str, ...]
    metric_family: str
    reference_config: str | None = None
    label_subset: tuple[int, ...] | None = None
    construction_models: tuple[str, ...] = ()
    source: str = "format1"
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

    @property
    def pinned(self) -> bool:
        return self.revision is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["configs"] = list(self.configs)
        d["label_subset"] = None if self.label_subset is None else list(self.label_subset)
        d["construction_models"] = list(self.construction_models)
        return d


SUITES: Registry[SuiteSpec] = Registry("suite")


def _register_defaults(reg: Registry[SuiteSpec]) -> None:
    star_configs = tuple(s.key for s in imagenet_star_shifts())
    hin = tuple(imagenet.index_of(w) for w in HARD_IMAGENET_WNIDS)
    in_a = imagenet.imagenet_a_indices()
    specs = [
        SuiteSpec(
            id="imagenet-star", title="ImageNet* rebuilt: base + 23 generated shifts, CLIP-filtered",
            repo_id="genshift-bench/imagenet-star", revision=None, configs=star_configs,
            metric_family="imagenet_star", reference_config="base",
            construction_models=("open_clip:ViT-H-14/laion2b_s32b_b79k",),
            paper="Vendrow et al., Dataset Interfaces (2023)",
        ),
        SuiteSpec(
            id="imagenet-star-upstream",
            title="ImageNet* as released by the authors (zips + masks.npy), read by an adapter",
            repo_id="madrylab/imagenet-star", revision=None, configs=star_configs,
            metric_family="imagenet_star", reference_config="base", source="upstream-imagenet-star",
            construction_models=("open_clip:ViT-H-14/laion2b_s32b_b79k",),
            paper="Vendrow et al., Dataset Interfaces (2023)",
            notes="Unpinned: the upstream repo's 40-char head sha is resolved and recorded at download. "
                  "The mask file comes from github.com/MadryLab/dataset-interfaces (masks.npy).",
        ),
        SuiteSpec(
            id="lance-hardimagenet",
            title="LANCE counterfactuals of the 15 Hard ImageNet classes (originals, reconstructions, edits)",
            repo_id="genshift-bench/lance-hardimagenet", revision=None,
            configs=("original", "reconstruction", "counterfactual"), metric_family="lance",
            reference_config="original", label_subset=hin, gated=True,
            construction_models=("openai/clip-vit-large-patch14",),
            paper="Prabhu et al., LANCE (NeurIPS 2023)",
        ),
        SuiteSpec(
            id="in-g-rn", title="IN-G-RN: generated images that fool a ResNet-50 (Wiles et al.)",
            repo_id="genshift-bench/in-g-rn", revision=None, configs=("generated",), metric_family="in_g",
            label_subset=in_a, construction_models=("resnet50.tv_in1k",),
            paper="Wiles, Albuquerque, Gowal, Discovering Bugs in Vision Models (2022)",
        ),
        SuiteSpec(
            id="in-g-vit", title="IN-G-ViT: generated images that fool a ViT-B/16 (Wiles et al.)",
            repo_id="genshift-bench/in-g-vit", revision=None, configs=("generated",), metric_family="in_g",
            label_subset=in_a, construction_models=("vit_base_patch16_224.augreg_in1k",),
            paper="Wiles, Albuquerque, Gowal, Discovering Bugs in Vision Models (2022)",
        ),
    ]
    for s in specs:
        reg.register(s.id, s)
    reg.freeze()


_register_defaults(SUITES)


def get_suite(suite_id: str) -> SuiteSpec:
    """The registered spec for ``suite_id`` (unknown ids get a 'did you mean')."""
    return SUITES.get(suite_id)


def list_suites(pattern: str = "*") -> list[str]:
    return SUITES.names(pattern)
