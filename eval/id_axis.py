"""ImageNet-val top-1 per model as the x-axis of an ID/OOD fit, from timm's results CSV (``docs/reproducing.md``,
``--id-accuracy``): a result is matched on its model's timm name and the input size its eval recorded; a
repeated (model, img_size) row or a result without its row is one error line, never a guess.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from genshift.errors import BenchError
from genshift.fsutil import read_text_limited
from genshift.identity import timm_name

MAX_BYTES = 16 * 2**20


@dataclass(frozen=True)
class IdRow:
    top1: float              # fraction
    img_size: int | None     # None: the CSV has no img_size column
    line: int


@dataclass(frozen=True)
class IdTable:
    path: str
    rows: dict[str, dict[int | None, IdRow]]   # model key -> img_size -> row


def read_id_table(path) -> IdTable:
    """Parse a results CSV (``model``, ``top1`` in percent, optional ``img_size``)."""
    p = Path(path)
    if not p.exists():
        raise BenchError(f"--id-accuracy {path}: no such file; give timm's results-imagenet.csv or a CSV of "
                         "model,img_size,top1")
    text = read_text_limited(p, max_bytes=MAX_BYTES, what="--id-accuracy CSV")  # bounded whatever st_size says
    reader = csv.DictReader(io.StringIO(text))
    fields = {(f or "").strip() for f in reader.fieldnames or []}
    if not {"model", "top1"} <= fields:
        raise BenchError(f"--id-accuracy {path}: needs columns 'model' and 'top1' (percent, as timm's "
                         f"results-imagenet.csv), found {', '.join(sorted(fields)) or 'none'}")
    sized = "img_size" in fields
    rows: dict[str, dict[int | None, IdRow]] = {}
    for n, raw in enumerate(reader, 2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if isinstance(v, str)}
        if not row.get("model"):
            continue
        where = f"--id-accuracy {path}:{n}"
        try:
            top1 = float(row.get("top1", ""))
            size = int(row["img_size"]) if sized else None
        except ValueError:
            raise BenchError(f"{where}: top1 {row.get('top1', '')[:20]!r} / img_size {row.get('img_size', '')[:20]!r} "
                             "is not a number") from None
        if not math.isfinite(top1) or not 0 <= top1 <= 100:
            raise BenchError(f"{where}: top1 {top1} is not a percentage in [0, 100]")
        key = timm_name(row["model"])
        by_size = rows.setdefault(key, {})
        if size in by_size:
            at = f" at img_size {size}" if sized else ""
            raise BenchError(f"{where}: {key}{at} is listed twice (also line {by_size[size].line}); keep one row per "
                             f"(model, img_size){'' if sized else ' or add an img_size column'}")
        by_size[size] = IdRow(top1 / 100, size, n)
    if not rows:
        raise BenchError(f"--id-accuracy {path} has no rows")
    return IdTable(str(path), rows)


def eval_img_size(result: dict) -> int | None:
    """The input size a result's eval ran at (``data_config.input_size`` = [C, H, W])."""
    size = (result.get("data_config") or {}).get("input_size")
    return int(size[-1]) if isinstance(size, (list, tuple)) and size else None


def id_accuracy(results: list[dict], table: IdTable) -> tuple[dict[str, float], dict[str, int | None]]:
    """Per result's model id: the CSV's top-1 at the eval's input size, and the size used; a result without its
    row is one error line (what the CSV has for the model instead, or that it lacks the model)."""
    acc, used, problems = {}, {}, []
    for r in results:
        mid = r["model"]["id"]
        key, size = timm_name(mid), eval_img_size(r)
        by_size = table.rows.get(key)
        row = None if by_size is None else by_size.get(size, by_size.get(None))
        if row is None:
            if by_size is None:
                problems.append(f"{mid} (as {key!r}) has no row")
            else:
                have = ", ".join(str(s) for s in sorted(s for s in by_size if s is not None))
                problems.append(f"{mid} was evaluated at {size} px but its rows are at {have} px")
            continue
        acc[mid], used[mid] = row.top1, row.img_size
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BenchError(f"--id-accuracy {table.path}: {problems[0]}{more}; add the row(s) or leave the model out")
    return acc, used
