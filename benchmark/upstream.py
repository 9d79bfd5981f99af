"""Adapter for the authors' ImageNet* release (``madrylab/imagenet-star``) and their filter masks.

The release is one zip per shift holding ``<shift>/<class>/<NN>.jpg`` (``NN`` = 00..49; ``<class>``
is the wnid, or in some copies the decimal class index), plus ``masks.npy`` in the code repo: a
pickled dict of 24 arrays of 50,000 0/1 flags with index ``50 * class + NN``. This module converts
the release into a format-1 suite **without re-encoding any JPEG**, so ``bench eval`` scores it
like any other suite:

- ``image_id`` = ``<shift>/<wnid>/<NN>``; ``label`` from the class folder, mapped explicitly;
- ``keep`` = ``mask[shift][50 * class + NN]``, indexed by (class, image number), never by file
  position (``specs/imagenet_star.md`` s7-8: one missing file shifts every later entry otherwise);
- missing and unexpected files are counted per shift, recorded in the manifest's provenance and
  reported (``strict=True`` makes them an error).

The mask is read without unpickling arbitrary objects: only the numpy callables a pickled dict of
arrays needs are allowed, then the content is validated.
"""

from __future__ import annotations

import io
import logging
import pickle
import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmark import imagenet
from benchmark.errors import BenchError, IntegrityError
from benchmark.fsutil import sha256_file
from benchmark.reader import LocalSuite
from benchmark.suites import imagenet_star_shifts

log = logging.getLogger(__name__)
PER_CLASS = 50
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
        shift = SHIFT_ALIASES.get(key, key)
        if shift not in known:
            raise IntegrityError(f"{name}: unknown shift key {key!r} (known: {', '.join(sorted(known))})")
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or not (arr.dtype.kind in "biu"):
            raise IntegrityError(f"{name}: key {key!r} is not a 1-d integer array")
        if arr.size != want:
            raise IntegrityError(f"{name}: key {key!r} has {arr.size:,} entries, expected {want:,} "
                                 f"({per_class} per class x {num_classes} classes)")
        if not np.isin(arr, (0, 1)).all():
            raise IntegrityError(f"{name}: key {key!r} has values other than 0 and 1")
        masks[shift] = arr.astype(bool)
    return masks


@dataclass(frozen=True)
class ReleaseImage:
    shift: str
    label: int
    number: int
    source: Path        # the zip, or the image file itself
    member: str | None  # path inside the zip


def _class_of(folder: str) -> int | None:
    if folder.isdigit():
        idx = int(folder)
        return idx if 0 <= idx < imagenet.NUM_CLASSES else None
    try:
        return imagenet.index_of(folder)
    except KeyError:
        return None


def _entries(root: Path, shift: str) -> Iterator[tuple[str, Path, str | None]]:
    """(relative name, source, zip member) for every file of one shift."""
    zpath = root / f"{shift}.zip"
    folder = root / shift
    if zpath.is_file():
        with zipfile.ZipFile(zpath) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    yield info.filename, zpath, info.filename
    elif folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                yield str(p.relative_to(root)), p, None
    else:
        raise BenchError(f"{root} has neither {shift}.zip nor a {shift}/ folder; download that shift or drop it "
                         "from --configs")


def scan_release(root: str | Path, shift: str, *, per_class: int = PER_CLASS
                 ) -> tuple[dict[tuple[int, int], ReleaseImage], list[str]]:
    """Index one shift's images by (class, image number); also list unexpected files."""
    root = Path(root)
    found: dict[tuple[int, int], ReleaseImage] = {}
    unexpected = []
    for name, source, member in _entries(root, shift):
        parts = name.split("/")
        m = IMAGE_RE.match(parts[-1])
        label = _class_of(parts[-2]) if len(parts) >= 2 else None
        if m is None or label is None or int(m.group(1)) >= per_class:
            unexpected.append(name)
            continue
        key = (label, int(m.group(1)))
        if key in found:
            unexpected.append(name)
            continue
        found[key] = ReleaseImage(shift, label, key[1], source, member)
    return found, unexpected


def convert_release(root: str | Path, out: str | Path, *, shifts: Iterable[str], mask: str | Path | None = None,
                    strict: bool = False, per_class: int = PER_CLASS, classes: Iterable[int] | None = None,
                    source: dict | None = None, overwrite: bool = False):
    """Convert a release folder (zips or extracted folders) into a format-1 suite at ``out``."""
    from datasets import Value

    from benchmark.writer import SuiteWriter
    from data_cards import render_card

    root = Path(root)
    shifts = list(dict.fromkeys(shifts))
    known = {s.key for s in imagenet_star_shifts()}
    for s in shifts:
        if s not in known:
            from benchmark.errors import unknown
            raise unknown("ImageNet* shift", s, known)
    masks = load_masks(mask, per_class=per_class) if mask else None
    if masks is not None:
        absent = [s for s in shifts if s not in masks]
        if absent:
            raise IntegrityError(f"the mask file has no entry for shift(s) {', '.join(absent)}")
    classes = list(range(imagenet.NUM_CLASSES)) if classes is None else sorted(set(classes))
    expected = {(c, n) for c in classes for n in range(per_class)}
    report = {}
    indexed = {}
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
    sources = {s: sha256_file(root / f"{s}.zip") for s in shifts if (root / f"{s}.zip").is_file()}
    fingerprint = {"zips_sha256": sources, "mask_sha256": sha256_file(mask) if mask else None,
                   "shifts": shifts, "per_class": per_class, "classes": classes if len(classes) < 1000 else "all"}
    with SuiteWriter(out, suite_id="imagenet-star-upstream", extra_features={"source_file": Value("string")},
                     fingerprint=fingerprint, overwrite=overwrite) as w:
        for s in shifts:
            items = sorted(indexed[s].values(), key=lambda r: (r.label, r.number))
            blocks = _blocks(items, classes)
            for shard, block in enumerate(blocks):
                n_shards = len(blocks)
                if w.shard_done(s, shard, n_shards):
                    continue
                w.write_shard(s, shard, n_shards, _rows(block, masks, per_class))
        generator = {"builder": "benchmark.upstream", "source": source or {"folder": str(root)},
                     "mask": None if mask is None else {"file": Path(mask).name, "sha256": fingerprint["mask_sha256"],
                                                        "index": "50 * class + image number"},
                     "zips_sha256": sources, "files": report}
        return w.finalize(generator=generator, card=lambda m: render_card(
            m, template="generic", license="mit", pretty_name="ImageNet* (upstream release, converted)",
            context={"note": "Converted from madrylab/imagenet-star without re-encoding; keep = the authors' mask."}))


def _blocks(items: list[ReleaseImage], classes: list[int]) -> list[list[ReleaseImage]]:
    """Deterministic shards: 100 classes per shard (50 x 100 = 5,000 images)."""
    by = {}
    for it in items:
        by.setdefault(classes.index(it.label) // 100, []).append(it)
    return [by[k] for k in sorted(by)]


def _rows(items: list[ReleaseImage], masks: dict | None, per_class: int):
    zf_cache: dict[Path, zipfile.ZipFile] = {}
    try:
        for it in items:
            if it.member is not None:
                zf = zf_cache.get(it.source) or zf_cache.setdefault(it.source, zipfile.ZipFile(it.source))
                data = zf.read(it.member)
                src = f"{it.source.name}:{it.member}"
            else:
                data = it.source.read_bytes()
                src = it.source.name
            wnid = imagenet.wnids()[it.label]
            yield {"image": {"bytes": data, "path": None}, "label": it.label,
                   "image_id": f"{it.shift}/{wnid}/{it.number:02d}", "config": it.shift,
                   "keep": True if masks is None else bool(masks[it.shift][per_class * it.label + it.number]),
                   "pair_id": None, "source_file": src}
    finally:
        for zf in zf_cache.values():
            zf.close()


def open_upstream(repo_id: str, *, revision: str | None, configs: list[str] | None = None, mask: str | None = None,
                  cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None) -> LocalSuite:
    """Download the requested shifts' zips at a pinned sha, convert once (cached), verify, open."""
    import os

    from huggingface_hub import constants

    from benchmark.hub import resolve_revision, snapshot

    shifts = configs or [s.key for s in imagenet_star_shifts()]
    sha = resolve_revision(repo_id, revision, endpoint=endpoint, token=token)
    snap = snapshot(repo_id, revision=sha, patterns=[f"{s}.zip" for s in shifts], cache_dir=cache_dir,
                    endpoint=endpoint, token=token)
    mask_key = sha256_file(mask)[:16] if mask else "nomask"
    base = Path(cache_dir or os.path.join(constants.HF_HOME, "genshift"))
    out = base / "upstream" / sha / mask_key / "-".join(sorted(shifts))
    if not (out / "manifest.json").is_file():
        convert_release(snap, out, shifts=shifts, mask=mask,
                        source={"repo_id": repo_id, "revision": sha})
    suite = LocalSuite.open(out, repo_id=repo_id, revision=sha)
    suite.verify(shifts)
    return suite
