"""Opening the suite a run scores (a local folder, a registry id or a Hub repo id), verified, with
its scoring spec; and the suite a stored result was made on (``bench verify --recheck``, ``bench diagnose``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from genshift import hub, upstream
from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import sha256_file
from genshift.identity import timm_name
from genshift.suite_format import LocalSuite
from genshift.suites import SUITES, construction_models, declared_scoring, get_suite


@dataclass(frozen=True)
class SuiteInfo:
    suite: LocalSuite
    metric_family: str
    reference_config: str | None
    construction_models: tuple[str, ...]
    pinned: bool
    source: str  # what the user gave


def open_suite(text: str, *, revision: str | None = None, configs: tuple[str, ...] | None = None,
               mask: str | None = None) -> SuiteInfo:
    """A local suite folder, a registry id or a Hub repo id -> a verified ``LocalSuite`` + its spec."""
    suite = hub.open_suite(text, revision=revision, configs=list(configs) if configs else None, mask=mask)
    key = text if text in SUITES else suite.suite_id
    spec = get_suite(key) if key in SUITES else None
    family, reference = declared_scoring(suite.manifest, spec)
    return SuiteInfo(suite, family, reference, construction_models(suite.manifest, spec), suite.pinned, source=text)


def reopen_suite(result: dict, *, suite: str | None = None, mask: str | None = None,
                 configs: tuple[str, ...] | None = None) -> SuiteInfo:
    """The suite a result was made on, opened as recorded (source, revision and, for the upstream
    ImageNet* adapter, the mask file) unless ``suite`` / ``mask`` point elsewhere; it must have the
    result's manifest hash."""
    rec = result["suite"]
    rec_mask = rec.get("mask") or {}
    src = suite or rec.get("source") or rec["id"]
    upstream_source = src == "imagenet-star-upstream" or upstream.is_release_folder(src)
    if mask is None and upstream_source and (not rec_mask or rec_mask.get("source") == "none"):
        mask = upstream.NO_MASK  # scored unfiltered (--no-mask, or before the released mask was the default)
        rec_mask = {}
    elif mask is None and rec_mask.get("source") == "released":
        rec_mask = {}  # the pinned file: fetched again if needed, and its sha256 is checked on use
    if mask is None and rec_mask:
        mask = rec_mask["path"]
        if mask is None:
            raise BenchError(f"the result was scored with a mask file of sha256 {rec_mask['sha256'][:12]}… whose "
                             "path was not recorded; pass that file with --mask")
        if not Path(mask).is_file():
            raise BenchError(f"the result was scored with the mask {mask} (sha256 {rec_mask['sha256'][:12]}…), which "
                             "is not there any more; pass the same file with --mask")
    if mask is not None and rec_mask and sha256_file(mask) != rec_mask["sha256"]:
        raise IntegrityError(f"mask {mask} is not the one the result was scored with (sha256 "
                             f"{rec_mask['sha256'][:12]}…); pass that file with --mask")
    info = open_suite(src, revision=None if suite else rec.get("revision"), configs=configs, mask=mask)
    if info.suite.manifest.sha256 != rec["manifest_sha256"]:
        raise IntegrityError(f"suite {src!r} has manifest {info.suite.manifest.sha256[:12]}…, the result was made on "
                             f"{rec['manifest_sha256'][:12]}…; pass the right suite with --suite")
    return info


def is_construction_model(model_id: str, construction: tuple[str, ...], weights_sha256: str | None = None) -> bool:
    """Whether a model is one of a suite's construction models (``genshift.suites.construction_models``):
    by id in normal form (``timm/x``, ``hf-hub:timm/x@sha`` and ``x`` are one model), or by weights
    sha256 for an entry ``sha256:<hex>``."""
    key = timm_name(model_id)
    return any((weights_sha256 is not None and c == f"sha256:{weights_sha256}") or key == timm_name(c)
               for c in construction if c)
