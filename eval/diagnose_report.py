"""Failure directions in pictures (``docs/leaderboard.md``): thumbnails, a self-contained HTML report (every
text escaped, no external resource) and the leaderboard's view of ``diagnose.json``, read as untrusted
input (:func:`load_report_for_view`: every thumbnail decoded and re-encoded).
"""

from __future__ import annotations

import base64
import html
import io
import math
from contextlib import suppress
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from genshift.errors import BenchError
from genshift.fsutil import atomic_write_bytes, read_json
from genshift.pixels import to_rgb

REPORT = "diagnose.json"
HTML_REPORT = "diagnose.html"
THUMB_CLASSES = 12     # classes (strongest first) that get pictures
THUMB_PER_SIDE = 6     # hardest and easiest images per class
THUMB_PX = 112
MAX_REPORT_BYTES = 32 * 2**20
MAX_IMAGE_PIXELS = 64 * 2**20


def _thumb(data: bytes) -> str | None:
    """A base64 JPEG thumbnail of an encoded image, or None if it does not decode."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                return None
            im = to_rgb(im)
            im.thumbnail((THUMB_PX, THUMB_PX))
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=80)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    return base64.b64encode(buf.getvalue()).decode("ascii")


def thumbnails(suite, where: dict[str, str], classes: list[dict]) -> dict[str, str]:
    """Thumbnails of the hardest/easiest images of the first ``THUMB_CLASSES`` classes; ``where`` maps
    an image id to the config it was read from."""
    wanted: dict[str, set[str]] = {}
    for d in classes[:THUMB_CLASSES]:
        for iid in d.get("hardest", [])[:THUMB_PER_SIDE] + d.get("easiest", [])[:THUMB_PER_SIDE]:
            if iid in where:
                wanted.setdefault(where[iid], set()).add(iid)
    out = {}
    for config, ids in sorted(wanted.items()):
        for f in suite.files(config):
            t = pq.read_table(f, columns=["image_id", "image"], filters=pc.field("image_id").isin(sorted(ids)))
            for iid, img in zip(t["image_id"].to_pylist(), t["image"].combine_chunks().field("bytes").to_pylist()):
                thumb = _thumb(img) if img else None
                if thumb:
                    out[iid] = thumb
    return out


def _num(v, fmt: str = "{:.3f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else "-"


def _beats_null(d: dict) -> bool:
    """A direction stronger than its permutation null's 95th percentile (a weaker one is not a finding)."""
    strength, p95 = d.get("strength"), d.get("null_p95")
    return isinstance(strength, (int, float)) and isinstance(p95, (int, float)) and strength > p95


def _captions(value) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(c[0]) for c in value if isinstance(c, (list, tuple)) and c and isinstance(c[0], str)]


def write_html(report: dict, path: str | Path) -> Path:
    """A self-contained HTML page of the report (inline CSS and images; all text escaped)."""
    e = lambda s: html.escape(str(s), quote=True)
    thumbs = report.get("thumbnails", {})

    def strip(ids, kind):
        cells = []
        for iid in ids[:THUMB_PER_SIDE]:
            if iid in thumbs:
                cells.append(f'<figure><img alt="{e(kind)} image {e(iid)}" src="data:image/jpeg;base64,{thumbs[iid]}">'
                             f"<figcaption>{e(iid)}</figcaption></figure>")
        return f'<div class="strip"><h4>{e(kind)}</h4>{"".join(cells)}</div>' if cells else ""

    sections = []
    for d in report["classes"]:
        pictures = strip(d.get("hardest", []), "hardest") + strip(d.get("easiest", []), "easiest")
        hard, easy = _captions(d.get("hard_captions")), _captions(d.get("easy_captions"))
        sections.append(
            f'<section><h3>{e(d["label"])} {e(d.get("name", ""))} <small>{e(d.get("wnid", ""))}</small></h3>'
            f'<p class="{"strong" if _beats_null(d) else "weak"}">strength {e(_num(d.get("strength")))} vs '
            f'permutation null p95 {e(_num(d.get("null_p95")))} (mean {e(_num(d.get("null_mean")))}); '
            f'{e(d.get("n_errors"))} errors of {e(d.get("n"))} images; status {e(d.get("status", ""))}</p>'
            + (f"<p>hard: {'; '.join(e(c) for c in hard[:3])}</p>" if hard else "")
            + (f"<p>easy: {'; '.join(e(c) for c in easy[:3])}</p>" if easy else "")
            + pictures + "</section>")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>Failure directions: {e(report.get("model", ""))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}section{{border-top:1px solid #ccc;padding:.5em 0}}
.strip{{display:flex;flex-wrap:wrap;gap:6px;align-items:flex-start}}.strip h4{{width:5em;margin:0}}
figure{{margin:0;font-size:10px;max-width:{THUMB_PX}px;overflow-wrap:anywhere}}.weak{{color:#777}}.strong{{color:#000}}</style>
</head><body>
<h1>Failure directions</h1>
<p>model {e(report.get("model", ""))} on suite {e(report.get("suite", {}).get("id", ""))} (configs
{e(", ".join(map(str, report.get("configs", []))))}; criterion {e(report.get("criterion", ""))}; CLIP
{e(report.get("clip", ""))}; {e(report.get("n_images", ""))} images). Per class: a linear SVM on CLIP embeddings
that predicts the model's mistakes (Jain et al., ICLR 2023); its strength is the cross-validated balanced accuracy,
against the same fit on permuted labels (null). Classes with strength above the null's 95th percentile have a
direction worth reading; the hardest and easiest images lie at the two ends of it.</p>
{"".join(sections)}
</body></html>
"""
    path = Path(path)
    atomic_write_bytes(path, page.encode("utf-8"))
    return path


def load_report_for_view(run_dir: str | Path, *, max_classes: int = THUMB_CLASSES) -> dict | None:
    """``diagnose.json`` of a store entry, checked and reduced to what the leaderboard shows; None if
    absent or not a valid report (a bad file never breaks the drilldown)."""
    p = Path(run_dir) / REPORT
    try:
        data = read_json(p, max_bytes=MAX_REPORT_BYTES, what=REPORT) if p.is_file() else None
    except BenchError:
        return None
    report = isinstance(data, dict) and data.get("kind") == "genshift-diagnose"
    if not report or not isinstance(data.get("classes"), list):
        return None
    raw_thumbs = data.get("thumbnails") if isinstance(data.get("thumbnails"), dict) else {}
    classes, thumbs = [], {}
    for d in data["classes"]:
        if len(classes) >= max_classes:
            break
        if not isinstance(d, dict) or d.get("status") != "ok":
            continue
        ids = {k: [str(i) for i in d.get(k, []) if isinstance(i, str)][:THUMB_PER_SIDE] if isinstance(d.get(k), list)
               else [] for k in ("hardest", "easiest")}
        for iid in ids["hardest"] + ids["easiest"]:
            if iid not in thumbs and isinstance(raw_thumbs.get(iid), str):
                with suppress(ValueError):  # not base64: left out, as a thumbnail that does not decode
                    if clean := _thumb(base64.b64decode(raw_thumbs[iid], validate=True)):
                        thumbs[iid] = clean
        hard = _captions(d.get("hard_captions"))
        classes.append({"label": str(d.get("label", "?")), "name": str(d.get("name", "")),
                        "strength_text": _num(d.get("strength")), "null_text": _num(d.get("null_p95")),
                        "n": str(d.get("n", "?")), "n_errors": str(d.get("n_errors", "?")),
                        "hard_caption": hard[0] if hard else "", **ids, "significant": _beats_null(d)})
    return {"model": str(data.get("model", "")), "classes": classes, "thumbnails": thumbs}
