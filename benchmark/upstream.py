"""The authors' ImageNet* release (``madrylab/imagenet-star``) and their filter masks as a format-1 suite, without
re-encoding, ``keep`` from the mask (``docs/hub.md`` section 5, ``docs/format.md`` section 7): :func:`open_upstream`
(the Hub repo at a sha) and :func:`open_release` (a local folder) convert once into ``<cache>/upstream/<key>/``."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import pickle
import re
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genshift import hubio, imagenet
from genshift.errors import BenchError, IntegrityError, OfflineError, unknown
from genshift.fsutil import StatKey, atomic_path, atomic_write_json, cache_root, canonical_json, read_json, sha256_file
from genshift.suite_format import LocalSuite, Manifest, SuiteWriter
from genshift.suites import get_suite, imagenet_star_shifts

log = logging.getLogger(__name__)

# The release as the paper scored it (pinned in the suite registry): masks.npy as last changed in that
# commit; madrylab/imagenet-star's commit c9af165 (its full sha is not known: a resolved main must start with it)
_PINS = get_suite("imagenet-star-upstream").extra
MASK_COMMIT = _PINS["mask"]["commit"]
MASK_URL = f"https://raw.githubusercontent.com/{_PINS['mask']['repo']}/{MASK_COMMIT}/{_PINS['mask']['path']}"
MASK_SIZE = _PINS["mask"]["size"]
MASK_SHA256 = _PINS["mask"]["sha256"]
DATA_REVISION_PREFIX = _PINS["revision_prefix"]
NO_MASK = ":none"  # mask argument meaning "score every image" (--no-mask); no file can be named so by accident

PER_CLASS = 50
MAX_MEMO_BYTES = 16 << 20  # zip-hashes.json: one line per zip ever hashed
SHIFT_ALIASES = {"at_dusk_simple": "at_dusk"}
IMAGE_RE = re.compile(r"^(\d{2})\.jpe?g$", re.IGNORECASE)
_NUMPY_CALLABLES = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _NUMPY_CALLABLES:
            return super().find_class(module, name)
        raise IntegrityError(f"the mask file references {module}.{name}; refusing to unpickle it (only numpy arrays "
                             "in a dict are allowed)")


def load_masks(path: str | Path, *, per_class: int = PER_CLASS, num_classes: int = imagenet.NUM_CLASSES
               ) -> dict[str, np.ndarray]:
    """Read and validate ``masks.npy`` (pickled dict) or a ``.npz``: shift -> bool array."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"mask file {str(path)!r} does not exist")
    name = path.name
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                raw = {k: z[k] for k in z.files}
        else:
            with open(path, "rb") as f:
                major, _ = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, _, dtype = read_header(f)
                if dtype != np.dtype(object) or shape != ():
                    raise IntegrityError(f"expected a pickled dict (0-d object array), got an array of dtype "
                                         f"{dtype} and shape {shape}")
                obj = _ArraysOnlyUnpickler(f).load()
            raw = obj.item() if isinstance(obj, np.ndarray) and obj.shape == () else obj
    except IntegrityError as e:
        raise IntegrityError(f"{name}: {e}") from None
    except (ValueError, OSError, pickle.UnpicklingError, EOFError) as e:
        raise IntegrityError(f"{name}: not a readable .npy/.npz mask file ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise IntegrityError(f"{name}: expected a dict of shift -> 0/1 array, got {type(raw).__name__}")
    known = {s.key for s in imagenet_star_shifts()}
    want = per_class * num_classes
    masks = {}
    for key, arr in raw.items():
        shift = SHIFT_ALIASES.get(key, key) if isinstance(key, str) else key
        if shift not in known:
            raise IntegrityError(f"{name}: unknown shift key {key!r} (known: {', '.join(sorted(known))})")
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "biu":
            raise IntegrityError(f"{name}: key {key!r} is not a 1-d integer array")
        if arr.size != want:
            raise IntegrityError(f"{name}: key {key!r} has {arr.size:,} entries, expected {want:,} "
                                 f"({per_class} per class x {num_classes} classes)")
        if not np.isin(arr, (0, 1)).all():
            raise IntegrityError(f"{name}: key {key!r} has values other than 0 and 1")
        if shift in masks:
            raise IntegrityError(f"{name}: shift {shift!r} appears twice (as {key!r} and an alias); keep one")
        masks[shift] = arr.astype(bool)
    return masks


@dataclass(frozen=True)
class ReleaseImage:
    shift: str
    label: int
    number: int
    source: Path        # the zip, or the image file itself
    member: str | None  # path inside the zip


def scan_release(root: str | Path, shift: str, *, per_class: int = PER_CLASS
                 ) -> tuple[dict[tuple[int, int], ReleaseImage], list[str]]:
    """Index one shift's images (its zip, else its folder) by (class, image number); also list unexpected files."""
    root = Path(root)
    zpath, folder = root / f"{shift}.zip", root / shift
    if zpath.is_file():
        with zipfile.ZipFile(zpath) as zf:
            entries = [(info.filename, zpath, info.filename) for info in zf.infolist() if not info.is_dir()]
    elif folder.is_dir():
        entries = [(str(p.relative_to(root)), p, None) for p in sorted(folder.rglob("*")) if p.is_file()]
    else:
        raise BenchError(f"{root} has neither {shift}.zip nor a {shift}/ folder; download that shift or drop it "
                         "from --configs")
    found: dict[tuple[int, int], ReleaseImage] = {}
    unexpected = []
    for name, source, member in entries:
        parts = name.split("/")
        m = IMAGE_RE.match(parts[-1])
        try:
            label = imagenet.parse_class(parts[-2]) if len(parts) >= 2 else None
        except BenchError:  # not a wnid or class index folder
            label = None
        key = (label, int(m.group(1))) if m and label is not None else None
        if key is None or key[1] >= per_class or key in found:
            unexpected.append(name)
        else:
            found[key] = ReleaseImage(shift, *key, source, member)
    return found, unexpected


def convert_release(root: str | Path, out: str | Path, *, shifts: Iterable[str], mask: str | Path | None = None,
                    strict: bool = False, per_class: int = PER_CLASS, classes: Iterable[int] | None = None,
                    source: dict | None = None, overwrite: bool = False, zip_sha256: dict[str, str] | None = None,
                    card: Callable[[Manifest], str] | None = None) -> Manifest:
    """A release folder (zips or extracted folders) -> a format-1 suite at ``out``; missing and unexpected files
    are counted in ``generator.files`` and warned about (an error with ``strict``). ``per_class``, ``classes``: a
    smaller layout (tests); ``zip_sha256``: hashes the caller has; ``card``: ``data_cards.upstream_card``."""
    from datasets import Value
    from tqdm.auto import tqdm

    root = Path(root)
    shifts = list(dict.fromkeys(shifts))
    known = {s.key for s in imagenet_star_shifts()}
    for s in shifts:
        if s not in known:
            raise unknown("ImageNet* shift", s, known)
    masks = load_masks(mask, per_class=per_class) if mask else None
    if absent := [s for s in shifts if masks is not None and s not in masks]:
        raise IntegrityError(f"the mask file has no entry for shift(s) {', '.join(absent)}")
    classes = list(range(imagenet.NUM_CLASSES)) if classes is None else sorted(set(classes))
    expected = {(c, n) for c in classes for n in range(per_class)}
    report, indexed = {}, {}
    for s in shifts:
        found, unexpected = scan_release(root, s, per_class=per_class)
        missing = sorted(expected - set(found))
        report[s] = {"found": len(found), "missing": len(missing), "unexpected": len(unexpected),
                     "missing_examples": [f"{imagenet.wnids()[c]}/{n:02d}" for c, n in missing[:5]],
                     "unexpected_examples": unexpected[:5]}
        if missing or unexpected:
            msg = (f"{s}: {len(missing)} missing file(s) (e.g. {', '.join(report[s]['missing_examples']) or '-'}), "
                   f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3]) or '-'})")
            if strict:
                raise IntegrityError(msg + "; pass a complete release or drop --strict")
            log.warning("%s", msg)
        indexed[s] = {k: v for k, v in found.items() if k in expected}
        if not indexed[s]:
            raise IntegrityError(f"{s}: no images of the expected layout <shift>/<wnid or index>/NN.jpg were found")
    zips = {s: root / f"{s}.zip" for s in shifts if (root / f"{s}.zip").is_file()}
    sources = {s: (zip_sha256 or {}).get(s) or sha256_file(z) for s, z in zips.items()}
    fingerprint = {"zips_sha256": sources, "mask_sha256": sha256_file(mask) if mask else None,
                   "shifts": shifts, "per_class": per_class, "classes": classes if len(classes) < 1000 else "all"}
    # the full release is ~1.2 M images (25-35 min): a bar on a terminal, silent otherwise (disable=None)
    bar = tqdm(total=sum(len(indexed[s]) for s in shifts), desc="convert ImageNet*", unit="img", disable=None)
    with bar, SuiteWriter(out, suite_id="imagenet-star-upstream", extra_features={"source_file": Value("string")},
                          fingerprint=fingerprint, overwrite=overwrite) as w:
        position = {c: i for i, c in enumerate(classes)}
        for s in shifts:
            # deterministic shards: 100 classes each (50 x 100 = 5,000 images)
            items = sorted(indexed[s].values(), key=lambda r: (r.label, r.number))
            blocks = [list(g) for _, g in itertools.groupby(items, key=lambda r: position[r.label] // 100)]
            for shard, block in enumerate(blocks):
                if not w.shard_done(s, shard, len(blocks)):
                    w.write_shard(s, shard, len(blocks), _rows(block, masks, per_class))
                bar.update(len(block))
        generator = {"builder": "genshift.upstream", "source": source or {"folder": root.name},
                     "mask": None if mask is None else {"file": Path(mask).name, "sha256": fingerprint["mask_sha256"],
                                                        "index": "50 * class + image number"},
                     "zips_sha256": sources, "files": report}
        return w.finalize(generator=generator, card=card)


def _rows(items: list[ReleaseImage], masks: dict | None, per_class: int):
    with contextlib.ExitStack() as stack:
        zips: dict[Path, zipfile.ZipFile] = {}
        for it in items:
            if it.member is not None:
                if it.source not in zips:
                    zips[it.source] = stack.enter_context(zipfile.ZipFile(it.source))
                data = zips[it.source].read(it.member)
                src = f"{it.source.name}:{it.member}"
            else:
                data = it.source.read_bytes()
                src = it.source.name
            wnid = imagenet.wnids()[it.label]
            yield {"image": {"bytes": data, "path": None}, "label": it.label, "config": it.shift, "pair_id": None,
                   "image_id": f"{it.shift}/{wnid}/{it.number:02d}", "source_file": src,
                   "keep": True if masks is None else bool(masks[it.shift][per_class * it.label + it.number])}


def is_release_folder(path: str | Path) -> bool:
    """A folder of released ``<shift>.zip`` files or ``<shift>/`` folders (and no ``manifest.json``)."""
    path = Path(path)
    return path.is_dir() and not (path / "manifest.json").exists() and bool(release_shifts(path))


def release_shifts(path: str | Path) -> list[str]:
    """The shifts present in a release folder, in the registry's order."""
    path = Path(path)
    return [s.key for s in imagenet_star_shifts() if (path / f"{s.key}.zip").is_file() or (path / s.key).is_dir()]


def _cache_root(cache_dir: str | None) -> Path:
    return (Path(cache_dir) if cache_dir else cache_root()) / "upstream"


def _source_key(root: Path, shifts: list[str], memo_file: Path) -> dict[str, str]:
    """Per shift: the zip's sha256 (remembered in ``memo_file`` by path and stat key: an unchanged multi-GB zip is
    hashed once), or for an extracted folder a hash of its listing (names and stat keys)."""
    try:
        memo = read_json(memo_file, max_bytes=MAX_MEMO_BYTES, what="zip hash memo")
    except IntegrityError:  # missing or damaged: hashed again
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    out = {}
    for s in shifts:
        z = root / f"{s}.zip"
        if z.is_file():
            key = f"{z.resolve()}|{StatKey.of(z)}"
            if key not in memo:
                memo[key] = sha256_file(z)
                atomic_write_json(memo_file, memo)
            out[s] = "zip:" + memo[key]
        elif (root / s).is_dir():
            listing = "".join(f"{f.relative_to(root)}|{StatKey.of(f)}\n" for f in sorted((root / s).rglob("*"))
                              if f.is_file())
            out[s] = "dir:" + hashlib.sha256(listing.encode()).hexdigest()
    return out


def _open_converted(release: Path, *, shifts: list[str], key: dict, mask: str | Path | None, strict: bool,
                    cache_dir: str | None, source: dict, repo_id: str | None = None,
                    revision: str | None = None, **convert_kw) -> LocalSuite:
    """Convert once into the cache (keyed by the release content, the mask and the shifts), then open + verify."""
    if mask is None:  # resolved by the callers: None here means --no-mask
        log.warning("--no-mask: every image is kept (the authors' CLIP filter is not applied); the paper scored "
                    "the filtered set (the default)")
    mask_sha = sha256_file(mask) if mask else None
    shifts = sorted(set(shifts))
    ident = {"release": key, "mask_sha256": mask_sha, "shifts": shifts, "options": convert_kw}
    digest = hashlib.sha256(canonical_json(ident)).hexdigest()[:24]
    out = _cache_root(cache_dir) / digest
    if not (out / "manifest.json").is_file():
        atomic_write_json(out.parent / f"{digest}.json", ident)  # says what the folder holds
        zips = {s: v[len("zip:"):] for s, v in key.items() if isinstance(v, str) and v.startswith("zip:")}
        convert_release(release, out, shifts=shifts, mask=mask, strict=strict, source=source, zip_sha256=zips,
                        **convert_kw)
    suite = LocalSuite.open(out, repo_id=repo_id, revision=revision)
    for s, f in suite.manifest.generator.get("files", {}).items():
        if strict and (f["missing"] or f["unexpected"]):  # a cached conversion made without --strict
            raise IntegrityError(f"{s}: {f['missing']} missing file(s), {f['unexpected']} unexpected (--strict); "
                                 "pass a complete release or drop --strict")
    suite.verify(shifts)
    return suite


def open_release(folder: str | Path, *, configs: list[str] | None = None, mask: str | Path | None = None,
                 strict: bool = False, cache_dir: str | None = None, **convert_kw) -> LocalSuite:
    """A local copy of the release -> a verified ``LocalSuite``, converted once into the cache. ``mask``: ``None``
    = the released mask (:func:`released_mask`), ``NO_MASK`` = none, else a file."""
    root = Path(folder)
    if not root.is_dir():
        raise BenchError(f"release folder {str(root)!r} does not exist")
    mask = resolve_mask(mask, cache_dir=cache_dir)
    shifts = list(configs) if configs else release_shifts(root)
    if not shifts:
        raise BenchError(f"{root} holds no <shift>.zip or <shift>/ folder of ImageNet*; see `bench suites "
                         "imagenet-star-upstream` for the shift names")
    key = _source_key(root, shifts, _cache_root(cache_dir) / "zip-hashes.json")
    return _open_converted(root, shifts=shifts, key=key, mask=mask, strict=strict, cache_dir=cache_dir,
                           source={"folder": root.name}, **convert_kw)


def open_upstream(repo_id: str, *, revision: str | None, configs: list[str] | None = None, mask: str | None = None,
                  strict: bool = False, cache_dir: str | None = None, endpoint: str | None = None,
                  token: str | None = None) -> LocalSuite:
    """Download the shifts' zips at a pinned sha (``main`` must be the paper's commit), convert once, verify."""
    shifts = list(configs) if configs else [s.key for s in imagenet_star_shifts()]
    mask = resolve_mask(mask, cache_dir=cache_dir)  # before any download: a missing mask is reported at once
    sha, reachable = hubio.resolve(repo_id, revision, endpoint=endpoint, token=token, cache_dir=cache_dir)
    if revision is None and not sha.startswith(DATA_REVISION_PREFIX):
        raise IntegrityError(f"{repo_id} main is now {sha[:12]}…, not the commit {DATA_REVISION_PREFIX}… the "
                             f"paper's release was scored at; pass --revision {sha} to score this revision anyway "
                             "(recorded in the result)")
    snap = hubio.snapshot(repo_id, revision=sha, patterns=[f"{s}.zip" for s in shifts], cache_dir=cache_dir,
                          endpoint=endpoint, token=token, local_only=not reachable)
    pin = {"repo_id": repo_id, "revision": sha}  # a commit sha fixes the zips' bytes: the cache key (no 60 GB hash)
    return _open_converted(snap, shifts=shifts, key=pin, mask=mask, strict=strict, cache_dir=cache_dir, source=pin,
                           repo_id=repo_id, revision=sha)


def released_mask_path(cache_dir: str | None = None) -> Path:
    """Where the released ``masks.npy`` is cached (and where to put it by hand when offline)."""
    return _cache_root(cache_dir).parent / "masks" / MASK_COMMIT / "masks.npy"


def released_mask(*, cache_dir: str | None = None, timeout: float = 60.0) -> Path:
    """The authors' ``masks.npy`` at the pinned commit, from the cache or downloaded once; its pinned size
    and sha256 are checked on every use (a download before it is renamed into place)."""
    dest = released_mask_path(cache_dir)
    where = (f"download {MASK_URL} ({MASK_SIZE:,} bytes, sha256 {MASK_SHA256}) and put it at {dest}, pass another "
             "file with --mask FILE, or score the unfiltered release with --no-mask")
    if dest.is_file():
        _check_released_mask(dest, f"the cached {dest}", "delete it (it is downloaded again) or " + where)
        return dest
    if hubio._offline():
        raise OfflineError(f"offline (HF_HUB_OFFLINE=1) and the authors' masks.npy is not cached; {where}"
                           f"{hubio.OFFLINE_ROUTE}")
    with atomic_path(dest) as tmp:
        try:
            with urllib.request.urlopen(MASK_URL, timeout=timeout) as r:
                tmp.write_bytes(r.read(MASK_SIZE + 1))  # bounded: one byte over the pinned size is enough to refuse
        except OSError as e:  # URLError and timeouts are OSErrors
            raise OfflineError(f"could not download the authors' masks.npy ({type(e).__name__}: "
                               f"{getattr(e, 'reason', e)}); {where}{hubio.OFFLINE_ROUTE}") from None
        _check_released_mask(tmp, f"the masks.npy downloaded from {MASK_URL}", where)
    log.info("downloaded the authors' masks.npy (%s) to %s", MASK_COMMIT[:12], dest)
    return dest


def _check_released_mask(path: Path, what: str, fix: str) -> None:
    size = path.stat().st_size
    digest = sha256_file(path) if size == MASK_SIZE else None
    if digest != MASK_SHA256:
        raise IntegrityError(f"{what} is not the released file ({size:,} bytes"
                             + (f", sha256 {digest[:12]}…" if digest else "")
                             + f"; expected {MASK_SIZE:,} bytes, sha256 {MASK_SHA256[:12]}…); {fix}")


def resolve_mask(mask: str | Path | None, *, cache_dir: str | None = None) -> Path | None:
    """The mask to apply: ``None`` -> :func:`released_mask`, ``NO_MASK`` -> none, else that (existing) file."""
    if mask is None:
        return released_mask(cache_dir=cache_dir)
    if str(mask) == NO_MASK:
        return None
    path = Path(mask)
    if not path.is_file():
        raise BenchError(f"mask file {str(path)!r} does not exist; pass the authors' masks.npy, or drop --mask to use "
                         "the released one")
    return path


def mask_record(mask: str | Path | None, generator: dict, *, cache_dir: str | None = None) -> dict | None:
    """A result's ``suite.mask`` (``path``, ``sha256``, ``source``) for a converted release, else ``None``."""
    if generator.get("builder") != "genshift.upstream":
        return None
    used = generator.get("mask")
    if used is None:
        return {"path": None, "sha256": None, "source": "none"}
    if used["sha256"] == MASK_SHA256:
        return {"path": str(released_mask_path(cache_dir)), "sha256": MASK_SHA256, "source": "released"}
    path = None if mask is None or str(mask) == NO_MASK else str(Path(mask).resolve())
    return {"path": path, "sha256": used["sha256"], "source": "file"}
