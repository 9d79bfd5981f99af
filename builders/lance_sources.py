"""Source images for LANCE: the 750 ImageNet validation images of the 15 Hard ImageNet classes.

Classes are matched by **wnid** (``benchmark.suites.HARD_IMAGENET_WNIDS``; "sunglasses" is class 837,
not 836). Accepted layouts of a local ImageNet validation folder:

- ``val/<wnid>/ILSVRC2012_val_XXXXXXXX.JPEG`` (class folders), or
- ``val/ILSVRC2012_val_XXXXXXXX.JPEG`` (flat) with a labels file: ``LOC_val_solution.csv``
  (``ImageId,PredictionString``) or lines ``<file> <wnid>``.

Each image is centre-cropped to a square and resized to 512 px with PIL bicubic, as the released
code does; grayscale or CMYK images are converted to RGB (the paper's fix). Missing classes or
images are reported by wnid.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

from benchmark import imagenet
from benchmark.errors import BenchError
from benchmark.suites import HARD_IMAGENET_WNIDS

log = logging.getLogger(__name__)
PER_CLASS = 50


@dataclass(frozen=True)
class SourceImage:
    source_id: str   # ILSVRC2012_val_XXXXXXXX
    wnid: str
    label: int
    path: Path


def _labels_file(root: Path) -> dict[str, str] | None:
    for name in ("LOC_val_solution.csv", "val_labels.txt", "labels.txt"):
        p = root / name
        if not p.is_file():
            p = root.parent / name
        if not p.is_file():
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
    found: dict[str, list[Path]] = {w: [] for w in wnids}
    if any((root / w).is_dir() for w in wnids):
        for w in wnids:
            d = root / w
            if d.is_dir():
                found[w] = sorted(p for p in d.iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
    else:
        labels = _labels_file(root)
        if labels is None:
            raise BenchError(f"{root} has no <wnid>/ class folders and no labels file (LOC_val_solution.csv or "
                             "'<file> <wnid>' lines); give the validation images in one of those layouts")
        for p in sorted(root.iterdir()):
            w = labels.get(p.stem)
            if w in found and p.suffix.lower() in (".jpeg", ".jpg", ".png"):
                found[w].append(p)
    missing = {w: per_class - len(v) for w, v in found.items() if len(v) < per_class}
    if missing:
        msg = "; ".join(f"{w} ({imagenet.names()[imagenet.index_of(w)]}): {len(found[w])}/{per_class}"
                        for w in list(missing)[:6])
        more = f" and {len(missing) - 6} more classes" if len(missing) > 6 else ""
        if not allow_partial:
            raise BenchError(f"the validation folder is missing Hard ImageNet images: {msg}{more}; complete it or pass "
                             "--allow-partial")
        log.warning("building from a partial validation set: %s%s", msg, more)
    return [SourceImage(p.stem, w, imagenet.index_of(w), p) for w in wnids for p in found[w][:per_class]]


def load_crop(path: Path, size: int = 512):
    """Centre square crop + bicubic resize to ``size``, RGB (grayscale/CMYK converted)."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        side = min(im.size)
        left, top = (im.width - side) // 2, (im.height - side) // 2
        return im.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)
