"""``bench verify``: check a result against its predictions files, and optionally against the model.

Checks, each reported by what differs:

1. every predictions file exists, has the recorded row count and sha256;
2. the config hash recomputes from the recorded model, suite, protocol and preprocessing;
3. every metric recomputes, from the stored predictions with the recorded options, to the
   stored value (floats within 1e-9 relative);
4. with ``recheck=N``: N seeded random images are re-run through the model (at the recorded
   weights) on the suite (whose manifest hash must match) and must give the stored top-1 class
   and true-class probability (within ``prob_tol``; ties within the tolerance are accepted).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark.errors import BenchError, IntegrityError
from benchmark.fsutil import sha256_file
from eval.predictions import read_predictions, topk_matrix
from eval.results import RESULT_FILE, config_hash, load_result
from eval.scoring import ScoringOptions, score


@dataclass
class VerifyReport:
    path: Path
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def result_path(path: str | Path) -> Path:
    p = Path(path)
    return p / RESULT_FILE if p.is_dir() else p


def verify_result(path: str | Path, *, recheck: int = 0, suite: str | None = None, mask: str | None = None,
                  checkpoint: str | None = None, device: str = "cpu", seed: int = 0,
                  prob_tol: float = 1e-3) -> VerifyReport:
    path = result_path(path)
    result = load_result(path)
    report = VerifyReport(path)
    base = path.parent
    tables = {}
    for entry in result["predictions"]:
        f = base / entry["path"]
        if not f.is_file():
            report.problems.append(f"{entry['path']} is missing")
            continue
        digest = sha256_file(f)
        if digest != entry["sha256"]:
            report.problems.append(f"{entry['path']} sha256 {digest[:12]}… differs from the result's "
                                   f"{entry['sha256'][:12]}… (file replaced or tampered)")
            continue
        table = read_predictions(f)
        if table.num_rows != entry["rows"]:
            report.problems.append(f"{entry['path']} has {table.num_rows} rows, the result says {entry['rows']}")
            continue
        tables[entry["config"]] = table
    report.checked.append(f"{len(tables)}/{len(result['predictions'])} predictions files (sha256, rows)")

    want = config_hash(result["model"], result["suite"], result["protocol"], result["data_config"])
    if want != result["config_hash"]:
        report.problems.append(f"config_hash {result['config_hash'][:12]}… does not match the recorded model, "
                               f"suite and protocol ({want[:12]}…)")
    report.checked.append("config hash")

    if len(tables) == len(result["predictions"]):
        recomputed = score(result["suite"]["metric_family"], tables, ScoringOptions(**result["protocol"]["scoring"]))
        diffs = compare(result["metrics"], recomputed, "metrics")
        report.problems += diffs[:20] + ([f"... and {len(diffs) - 20} more metric differences"] if len(diffs) > 20 else [])
        report.checked.append("every metric recomputed from the predictions")
    if recheck and not report.problems:
        report.problems += _recheck(result, tables, n=recheck, suite=suite, mask=mask, checkpoint=checkpoint, device=device,
                                    seed=seed, prob_tol=prob_tol)
        report.checked.append(f"{recheck} images re-run through the model")
    return report


def compare(stored, recomputed, where: str, *, rel: float = 1e-9) -> list[str]:
    """Paths where two metric trees differ (floats within ``rel``)."""
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        out = []
        for k in sorted(set(stored) | set(recomputed)):
            if k not in stored or k not in recomputed:
                out.append(f"{where}.{k}: present in only one of stored/recomputed")
            else:
                out += compare(stored[k], recomputed[k], f"{where}.{k}", rel=rel)
        return out
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        return [d for i, (a, b) in enumerate(zip(stored, recomputed)) for d in compare(a, b, f"{where}[{i}]", rel=rel)]
    if isinstance(stored, (int, float)) and isinstance(recomputed, (int, float)) \
            and not isinstance(stored, bool) and not isinstance(recomputed, bool):
        if math.isclose(stored, recomputed, rel_tol=rel, abs_tol=1e-12):
            return []
    elif stored == recomputed:
        return []
    return [f"{where}: stored {stored!r}, recomputed {recomputed!r}"]


def _recheck(result: dict, tables: dict, *, n: int, suite: str | None, mask: str | None, checkpoint: str | None,
             device: str, seed: int, prob_tol: float) -> list[str]:
    import torch
    from PIL import Image

    from eval.models import load_classifier
    from eval.runner import reopen_suite

    try:
        info = reopen_suite(result, suite=suite, mask=mask, configs=tuple(tables))
    except IntegrityError as e:
        return [str(e)]
    m = result["model"]
    if m["source"] == "checkpoint" and not checkpoint:
        raise BenchError("this result used local weights; pass them with --checkpoint to re-run images")
    name = m["id"] if m["source"] != "hf-hub" else f"hf-hub:{m['id']}@{m['weights_revision']}"
    clf = load_classifier(name, checkpoint=checkpoint, device=device, remap_by_order=True,
                          preprocess=result["protocol"].get("preprocess", "timm"))
    if m.get("weights_sha256") and clf.weights_sha256 and clf.weights_sha256 != m["weights_sha256"]:
        return [f"weights sha256 {clf.weights_sha256[:12]}… differ from the result's {m['weights_sha256'][:12]}…"]

    rng = np.random.default_rng(seed)
    pool = [(cfg, i) for cfg, t in sorted(tables.items()) for i in range(t.num_rows)]
    picks = [pool[i] for i in rng.choice(len(pool), size=min(n, len(pool)), replace=False)]
    problems = []
    for cfg in sorted({c for c, _ in picks}):
        t = tables[cfg]
        rows = [i for c, i in picks if c == cfg]
        ids = [t["image_id"][i].as_py() for i in rows]
        images = _images_by_id(info.suite, cfg, set(ids))
        x = torch.stack([clf.transform(Image.open(io.BytesIO(images[i])).convert("RGB")) for i in ids]).to(device)
        with torch.inference_mode():
            probs = clf.model(x).float().softmax(-1).cpu().numpy()
        top = topk_matrix(t.take(rows))
        stored_p = t["true_prob"].to_numpy()[rows]
        labels = t["label"].to_numpy()[rows]
        for j, iid in enumerate(ids):
            p = probs[j]
            if abs(p[labels[j]] - stored_p[j]) > prob_tol:
                problems.append(f"{cfg}/{iid}: true-class probability {p[labels[j]]:.5f} re-run vs {stored_p[j]:.5f} stored")
            elif int(p.argmax()) != int(top[j, 0]) and p.max() - p[top[j, 0]] > prob_tol:
                problems.append(f"{cfg}/{iid}: top-1 class {int(p.argmax())} re-run vs {int(top[j, 0])} stored")
    return problems


def _images_by_id(suite, config: str, ids: set[str]) -> dict[str, bytes]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out = {}
    for f in suite.files(config):
        t = pq.read_table(f, columns=["image_id", "image"], filters=pc.field("image_id").isin(list(ids)))
        for iid, img in zip(t["image_id"].to_pylist(), t["image"].combine_chunks().field("bytes").to_pylist()):
            out[iid] = img
    return out


def verify_suite_dir(path: str | Path) -> str:
    """Verify a suite folder against its manifest; returns a one-line summary."""
    from benchmark.reader import LocalSuite

    suite = LocalSuite.open(path)
    suite.verify()
    m = suite.manifest
    rows = sum(c.rows for c in m.configs.values())
    return (f"{path}: suite {m.suite_id} v{m.suite_version}, {len(m.configs)} configs, {rows} rows, "
            f"{len(m.files)} files verified; manifest sha256 {m.sha256}")
