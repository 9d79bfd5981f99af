"""Source images for LANCE: the 750 ImageNet validation images of the 15 Hard ImageNet classes, matched by
wnid, from a local folder or a Hub dataset (``docs/builders.md``, LANCE "Sources"); missing ones reported by wnid."""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

from genshift import imagenet
from genshift.errors import BenchError
from genshift.suites import HARD_IMAGENET_WNIDS

log = logging.getLogger(__name__)
PER_CLASS = 50
SUFFIXES = (".jpeg", ".jpg", ".png")


@dataclass(frozen=True)
class SourceImage:
    source_id: str   # ILSVRC2012_val_XXXXXXXX
    wnid: str
    label: int
    path: Path | None            # a local file, or
    data: bytes | None = None    # the encoded image (from a Hub parquet row)


def _labels_file(root: Path) -> dict[str, str] | None:
    for name in ("LOC_val_solution.csv", "val_labels.txt", "labels.txt"):
        p = next((d / name for d in (root, root.parent) if (d / name).is_file()), None)
        if p is None:
            continue
        out = {}
        if p.suffix == ".csv":
            with open(p, newline="") as f:
                for row in csv.DictReader(f):
                    out[row["ImageId"]] = row["PredictionString"].split()[0]
        else:
            for line in p.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2:
                    out[Path(parts[0]).stem] = parts[1]
        return out
    return None


def find_sources(root: str | Path, *, wnids=HARD_IMAGENET_WNIDS, per_class: int = PER_CLASS,
                 allow_partial: bool = False) -> list[SourceImage]:
    """The Hard ImageNet validation images under ``root``, sorted by (class order, file name)."""
    root = Path(root)
    if not root.is_dir():
        raise BenchError(f"ImageNet validation folder {str(root)!r} does not exist; pass --imagenet-val DIR")
    def images(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES) if folder.is_dir() else []

    if any((root / w).is_dir() for w in wnids):
        found = {w: images(root / w) for w in wnids}
    else:
        labels = _labels_file(root)
        if labels is None:
            raise BenchError(f"{root} has no <wnid>/ class folders and no labels file (LOC_val_solution.csv or "
                             "'<file> <wnid>' lines); give the validation images in one of those layouts")
        flat = images(root)
        found = {w: [p for p in flat if labels.get(p.stem) == w] for w in wnids}
    _report_missing({w: len(v) for w, v in found.items()}, per_class, allow_partial, "the validation folder")
    return [SourceImage(p.stem, w, imagenet.index_of(w), p) for w in wnids for p in found[w][:per_class]]


def _report_missing(counts: dict[str, int], per_class: int, allow_partial: bool, where: str) -> None:
    missing = [w for w, n in counts.items() if n < per_class]
    if not missing:
        return
    msg = "; ".join(f"{w} ({imagenet.names()[imagenet.index_of(w)]}): {counts[w]}/{per_class}" for w in missing[:6])
    more = f" and {len(missing) - 6} more classes" if len(missing) > 6 else ""
    if not allow_partial:
        raise BenchError(f"{where} is missing Hard ImageNet images: {msg}{more}; complete it or pass --allow-partial")
    log.warning("building from a partial validation set: %s%s", msg, more)


def find_hub_sources(ref: str, *, files: str = "data/validation-*.parquet", wnids=HARD_IMAGENET_WNIDS,
                     per_class: int = PER_CLASS, allow_partial: bool = False, cache_dir: str | None = None,
                     endpoint: str | None = None) -> tuple[list[SourceImage], dict]:
    """The Hard ImageNet validation images of a Hub dataset ``ORG/NAME[@revision]`` (the parquet files matching
    ``files`` at the resolved commit; in file order, the first ``per_class`` of each class), and provenance."""
    import pyarrow.parquet as pq

    from genshift import hubio

    repo_id, _, rev = ref.partition("@")
    if not hubio.is_repo_id(repo_id):
        raise BenchError(f"{repo_id!r} is not a Hub repo id; give --hub-val ORG/NAME[@SHA]")
    sha = hubio.resolve_revision(repo_id, rev or None, endpoint=endpoint, cache_dir=cache_dir,
                                 pin_hint=f"as --hub-val {repo_id}@<sha>")
    root = hubio.snapshot(repo_id, revision=sha, patterns=[files], cache_dir=cache_dir, endpoint=endpoint)
    paths = sorted(root.glob(files))
    if not paths:
        raise BenchError(f"{repo_id}@{sha[:12]} has no files matching {files!r}; pass the validation parquet files "
                         "with --hub-val-files")
    by_index = {imagenet.index_of(w): w for w in wnids}
    found: dict[str, list[SourceImage]] = {w: [] for w in wnids}
    for f in paths:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        for col in ("image", "label"):
            if col not in names:
                raise BenchError(f"{f.name} has no {col!r} column (columns: {', '.join(names)}); give an ImageNet "
                                 "validation dataset with image and label columns")
        for g in range(pf.num_row_groups):
            images = None  # read only for a row group that holds a wanted row
            for i, y in enumerate(pf.read_row_group(g, columns=["label"]).column(0).to_pylist()):
                w = by_index.get(y) if isinstance(y, int) else y
                if w not in found or len(found[w]) == per_class:
                    continue
                if images is None:
                    images = pf.read_row_group(g, columns=["image"]).column(0)
                cell = images[i].as_py()
                data, name = (cell.get("bytes"), cell.get("path")) if isinstance(cell, dict) else (cell, None)
                if not data:
                    raise BenchError(f"{f.name}: row {i} of row group {g} has no embedded image bytes; use a dataset "
                                     "with embedded images or --imagenet-val")
                sid = Path(name).stem if name else f"{f.stem}-{g:04d}-{i:05d}"
                found[w].append(SourceImage(sid, w, imagenet.index_of(w), None, data))
    _report_missing({w: len(v) for w, v in found.items()}, per_class, allow_partial, f"{repo_id}@{sha[:12]}")
    return [s for w in wnids for s in found[w]], {"repo_id": repo_id, "revision": sha, "files": files}


def load_crop(src: SourceImage | Path, size: int = 512):
    """Centre square crop + bicubic resize to ``size`` (PIL, as the released code), RGB (grayscale/CMYK converted)."""
    import io

    from PIL import Image, UnidentifiedImageError

    where = src if isinstance(src, Path) else (src.path or src.source_id)
    try:
        im = Image.open(src if isinstance(src, Path) else (src.path or io.BytesIO(src.data)))
        im.load()
    except (UnidentifiedImageError, OSError) as e:
        raise BenchError(f"source image {str(where)!r} is not a readable image ({e}); replace it") from None
    im = im.convert("RGB")
    side = min(im.size)
    left, top = (im.width - side) // 2, (im.height - side) // 2
    return im.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)
