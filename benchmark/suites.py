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

from genshift import imagenet
from genshift.families import FAMILIES
from genshift.hubio import SHA_RE
from genshift.registry import Registry

METRIC_FAMILIES = tuple(FAMILIES)  # the registered metric families (genshift.families)

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
    text = resources.files("genshift").joinpath("_data", "imagenet_star_shifts.yaml").read_text()
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
    metric_family : which metrics ``bench eval`` computes (a ``genshift.families`` name).
    reference_config : in-distribution config other configs are compared with, if any.
    label_subset : ImageNet-1k indices that occur as labels (``None`` = all 1000). Models are
        still scored on the full 1000-way output.
    construction_models : models used to build, mine or filter the data; results of these models
        are flagged (their scores are biased by construction).
    source : ``"format1"`` (our suites) or ``"upstream-imagenet-star"`` (the released zips, read
        through ``genshift.upstream``).
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
            extra={"tokens": {"repo_id": "madrylab/imagenet-star-tokens",
                              "revision": "4bccca2357674563484cd290ef21bfe7fe54ac1b"}},
        ),
        SuiteSpec(
            id="imagenet-star-upstream",
            title="ImageNet* as released by the authors (zips + masks.npy), read by an adapter",
            repo_id="madrylab/imagenet-star", revision=None, configs=star_configs,
            metric_family="imagenet_star", reference_config="base", source="upstream-imagenet-star",
            construction_models=("open_clip:ViT-H-14/laion2b_s32b_b79k",),
            paper="Vendrow et al., Dataset Interfaces (2023)",
            notes="The paper's release: main must resolve to the commit c9af165... ('in', 2023-03-07; its full sha "
                  "is not published), else --revision is required. The authors' masks.npy (github.com/MadryLab/"
                  "dataset-interfaces at 769dfa2, sha256-checked) is fetched and applied by default; --no-mask "
                  "scores every image.",
            # facts of the release, used by genshift.upstream
            extra={"revision_prefix": "c9af165",
                   "mask": {"repo": "MadryLab/dataset-interfaces", "commit": "769dfa2ba4d1ca493f9c746fbc840782b76d3b41",
                            "path": "masks.npy", "size": 1_201_690,
                            "sha256": "bf69ebfab434eeaf1d410249403b622dbb3cc0479c6097229768ef419d2f4d91"}},
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


def declared_scoring(manifest) -> tuple[str, str | None]:
    """Metric family and reference config a suite outside the registry declares in its manifest's
    ``generator`` (``bench import-folder`` does for multi-shift folders); ``accuracy`` otherwise.
    Eval and verify both take a non-registry suite's scoring from here."""
    from genshift.errors import IntegrityError

    gen = manifest.generator if isinstance(manifest.generator, dict) else {}
    family, reference = gen.get("metric_family", "accuracy"), gen.get("reference_config")
    if family not in METRIC_FAMILIES or not (reference is None or (isinstance(reference, str)
                                                                   and reference in manifest.configs)):
        raise IntegrityError(f"suite {manifest.suite_id!r} declares metric family {str(family)[:40]!r} with reference "
                             f"config {str(reference)[:70]!r}; expected one of {', '.join(METRIC_FAMILIES)} and one "
                             "of its configs; fix or re-import the suite")
    return family, reference


def construction_models(manifest, spec: SuiteSpec | None) -> tuple[str, ...]:
    """The models that built, mined or filtered a suite, whose results are flagged.

    What the suite recorded at build time comes first: a builder's target (``generator.target``,
    IN-G's mining classifier) is the model that made *this* build, whatever ``--target`` it was
    given. Local target weights are named by their sha256 (``sha256:<hex>``: the architecture
    name alone would flag every checkpoint of it). Suites that recorded no target (released
    suites, ImageNet* and LANCE, whose construction models are CLIP filters) fall back to the
    registry's ``construction_models``.
    """
    from genshift.identity import timm_name

    gen = manifest.generator if isinstance(manifest.generator, dict) else {}
    target = gen.get("target")
    if isinstance(target, dict):
        sha, mid = target.get("weights_sha256"), target.get("id")
        if target.get("source") == "checkpoint" and isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
            return (f"sha256:{sha}",)
        declared = target.get("declared_name")  # local weights: the name they were built as
        if isinstance(mid, str) and mid.strip():
            return (timm_name(declared if isinstance(declared, str) and declared.strip() else mid)[:200],)
    return spec.construction_models if spec else ()

