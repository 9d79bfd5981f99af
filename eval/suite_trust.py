"""Opening suites and trusting them: the suite a run scores (a local folder, a registry id or a Hub repo id),
verified, with its scoring spec; the suite a stored result was made on (``bench verify --recheck``,
``bench diagnose``); and which suite manifests a verifier trusts (``--suite``, ``--suites DIR``, the registry's
pinned ones; never a manifest shipped with a result or found where it says) and what a result is checked
against (``docs/results.md``, "Trust roots")."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub as hf

from genshift import hub, upstream
from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import read_limited, sha256_file
from genshift.identity import timm_name
from genshift.suite_format import MANIFEST, MAX_MANIFEST_BYTES, LocalSuite, Manifest
from genshift.suites import SUITES, construction_models, declared_scoring, get_suite

log = logging.getLogger(__name__)


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


@dataclass
class SuiteRef:
    """A suite manifest with where it came from; ``local`` when the suite's rows are at hand too."""

    manifest: Manifest
    origin: str
    trusted: bool
    local: object | None = None  # genshift.suite_format.LocalSuite
    opens: str | None = None     # a manifest alone: the trusted name its images open by (a registry id)
    _rows: dict = field(default_factory=dict, repr=False)

    @property
    def sha256(self) -> str:
        return self.manifest.sha256

    def rows_digest(self, config: str) -> str | None:
        """The config's rows digest: recorded in the manifest (format 1.1), else computed from the rows."""
        recorded = self.manifest.configs[config].rows_digest
        return recorded or (self.local.rows_digest(config) if self.local is not None else None)

    def rows(self, config: str) -> tuple[list, list, list] | None:
        """``(image_ids, labels, keeps)`` of a config, read from the suite folder (files verified first)."""
        if self.local is None:
            return None
        if config not in self._rows:
            self.local.verify([config])
            t = self.local.read_columns(config, ["image_id", "label", "keep"])
            self._rows[config] = (t["image_id"].to_pylist(), t["label"].to_pylist(), t["keep"].to_pylist())
        return self._rows[config]


def load_manifest_file(path: Path, *, where: str | None = None) -> Manifest:
    """A manifest file on its own (no data): the reader's limits and schema (``Manifest.from_bytes``)."""
    return Manifest.from_bytes(read_limited(path, max_bytes=MAX_MANIFEST_BYTES, what="suite manifest"),
                               where=where or str(path))


def open_ref(source: str, *, trusted: bool, revision: str | None = None, mask: str | None = None) -> SuiteRef:
    """A suite folder, a manifest file, or (downloaded) a registry id / Hub repo."""
    path = Path(source)
    if path.is_dir() and (path / MANIFEST).is_file():
        local = LocalSuite.open(path)
        return SuiteRef(local.manifest, f"suite folder {path}", trusted, local)
    if path.is_file():
        return SuiteRef(load_manifest_file(path), f"manifest {path}", trusted)
    info = open_suite(source, revision=revision, mask=mask)
    return SuiteRef(info.suite.manifest, f"suite {source}", trusted, info.suite)


@dataclass
class TrustedSuites:
    """Trusted manifests by sha256 (``--suite``, ``--suites DIR``), plus registry-pinned manifests; ``download``:
    may fetch a registry manifest (``bench verify``), else only the local Hub cache (the store)."""

    by_sha: dict[str, SuiteRef] = field(default_factory=dict)
    registry: bool = True
    download: bool = False
    _registry_seen: set = field(default_factory=set, repr=False)

    @classmethod
    def from_paths(cls, paths, *, registry: bool = True, download: bool = False) -> TrustedSuites:
        out = cls(registry=registry, download=download)
        for p in paths or ():
            out.add_path(Path(p))
        return out

    def add(self, ref: SuiteRef) -> None:
        self.by_sha.setdefault(ref.sha256, ref)

    def add_path(self, path: Path) -> None:
        """A suite folder, a manifest file, or a folder of them (one level)."""
        if not path.exists():
            raise BenchError(f"trusted suites path {str(path)!r} does not exist; give suite folders or manifest files")
        if path.is_file() or (path / MANIFEST).is_file():
            self.add(open_ref(str(path), trusted=True))
            return
        found = 0
        for child in sorted(path.iterdir()):
            if child.is_dir() and (child / MANIFEST).is_file() or child.is_file() and child.suffix == ".json":
                try:
                    self.add(open_ref(str(child), trusted=True))
                    found += 1
                except BenchError as e:
                    log.warning("skipping %s in the trusted suites: %s", child, e)
        if not found:
            raise BenchError(f"{path} holds no suite folders or manifest files; give the folder of trusted manifests")

    def lookup(self, suite: dict) -> SuiteRef | None:
        """The trusted manifest with the result's ``suite.manifest_sha256``, if any; a registered suite's manifest
        at its pinned sha (only ``manifest.json``) is looked up once."""
        sha, suite_id = suite.get("manifest_sha256"), suite.get("id")
        if sha not in self.by_sha and self.registry and suite_id not in self._registry_seen:
            self._registry_seen.add(suite_id)
            spec = SUITES.get(suite_id) if suite_id in SUITES else None
            if spec is not None and spec.revision and spec.source == "format1":
                ref = hub_manifest(spec.repo_id, spec.revision, download=self.download, trusted=True,
                                   origin=f"registry {suite_id} ({spec.repo_id}@{spec.revision[:12]})")
                if ref is not None:
                    ref.opens = suite_id
                    self.add(ref)
        return self.by_sha.get(sha)


def hub_manifest(repo_id: str, revision: str, *, download: bool, trusted: bool, origin: str | None = None):
    """The ``manifest.json`` of a Hub dataset repo at a commit sha (only that file), or None."""
    try:
        if download:
            path = hf.hf_hub_download(repo_id, MANIFEST, repo_type="dataset", revision=revision)
        else:
            path = hf.try_to_load_from_cache(repo_id, MANIFEST, repo_type="dataset", revision=revision)
            if not isinstance(path, str):
                return None
        manifest = load_manifest_file(Path(path), where=f"{repo_id}@{revision[:12]}/{MANIFEST}")
    except (OSError, ValueError, BenchError, hf.errors.HfHubHTTPError) as e:
        log.debug("manifest of %s@%s unavailable: %s", repo_id, revision, e)
        return None
    return SuiteRef(manifest, origin or f"{repo_id}@{revision[:12]}", trusted)
