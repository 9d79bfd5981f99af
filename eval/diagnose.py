"""``bench diagnose`` (``docs/leaderboard.md``, "Failure directions in pictures"): a result's predictions joined
with CLIP embeddings of its images, one SVM per class (``genshift.eval.failure_directions``), written as
``diagnose.json`` and ``diagnose.html`` next to the result. It never changes benchmark scores.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError
from genshift.eval import diagnose_report
from genshift.eval.embeddings import ClipEncoder, ImageView, suite_image_embeddings
from genshift.eval.failure_directions import DirectionOptions, Whitening, class_direction
from genshift.eval.metrics import parent_failures
from genshift.eval.predictions import read_predictions, topk_matrix
from genshift.eval.results import load_result
from genshift.eval.suite_open import open_suite, reopen_suite
from genshift.fsutil import atomic_write_json, sha256_file

CRITERIA = ("top1", "top3", "parent")


def correctness(table, criterion: str) -> np.ndarray:
    """Per-image 'model was right' under a criterion (IN-G suites: top-3 or WordNet parent)."""
    rank = table["true_rank"].to_numpy()
    if criterion == "top1":
        return rank == 0
    if criterion == "top3":
        return rank < 3
    if criterion == "parent":
        return ~parent_failures(table["label"].to_numpy().astype(np.int64), topk_matrix(table).astype(np.int64))
    raise BenchError(f"unknown criterion {criterion!r}; use one of {', '.join(CRITERIA)}")


def parse_whiten_reference(text: str | None) -> tuple[str | None, list[str]] | None:
    """``--whiten-reference``: None / ``analysed`` (the analysed images), ``CONFIG[,CONFIG]`` (configs
    of the result's suite) or ``SUITE:CONFIG[,CONFIG]`` (another suite: folder, registry or Hub id)."""
    if text is None or text == "analysed":
        return None
    suite, _, configs = text.rpartition(":")
    names = [c.strip() for c in configs.split(",") if c.strip()]
    if not names:
        raise BenchError(f"--whiten-reference {text!r}: expected 'analysed', CONFIG[,CONFIG] or SUITE:CONFIG[,CONFIG]")
    return suite or None, names


def diagnose(result_path: str | Path, *, encoder: ClipEncoder, cache_dir: str | Path, configs: list[str] | None = None,
             classes: list[int] | None = None, criterion: str = "top1", options: DirectionOptions | None = None,
             suite: str | None = None, mask: str | None = None, progress: bool = True,
             image_view: str = "classifier-square", whiten_reference: str | None = None) -> tuple[dict, Path]:
    """Failure directions of one result. ``image_view``: how CLIP sees the images
    (``genshift.eval.embeddings.ImageView``; default the authors' square resize of the classifier's input).
    ``whiten_reference``: the images whose CLIP statistics whiten the embeddings
    (:func:`parse_whiten_reference`; the authors used the training split; default: the analysed images)."""
    options = options or DirectionOptions()
    path = Path(result_path)
    path = path / "result.json" if path.is_dir() else path
    result = load_result(path)
    entries = {p["config"]: p for p in result["predictions"]}
    configs = configs or list(entries)
    for c in configs:
        if c not in entries:
            raise BenchError(f"config {c!r} is not in the result (has {', '.join(entries)})")
        f = path.parent / entries[c]["path"]
        if not f.is_file() or sha256_file(f) != entries[c]["sha256"]:
            raise IntegrityError(f"{entries[c]['path']} is missing or does not match the result's sha256; run "
                                 "bench verify")
    ref = parse_whiten_reference(whiten_reference)
    own_ref = ref is not None and ref[0] is None
    info = reopen_suite(result, suite=suite, mask=mask,
                        configs=tuple(dict.fromkeys(configs + (ref[1] if own_ref else []))))
    view = ImageView(image_view, result["data_config"] if image_view == "classifier-square" else None)

    ids_all, emb_all, labels_all, right_all = [], [], [], []
    where: dict[str, str] = {}  # image id -> the config it was read from (for thumbnails)
    for c in configs:
        t = read_predictions(path.parent / entries[c]["path"])
        if result["protocol"]["scoring"]["filter"]:
            t = t.filter(t["keep"])
        ids, emb = suite_image_embeddings(info.suite, c, encoder, cache_dir=cache_dir, view=view)
        pos, scored = {i: k for k, i in enumerate(ids)}, t["image_id"].to_pylist()
        ids_all += scored
        where.update({i: c for i in scored if i not in where})
        emb_all.append(emb[[pos[i] for i in scored]])
        labels_all.append(t["label"].to_numpy().astype(np.int64))
        right_all.append(correctness(t, criterion))
    emb, labels, right = (np.concatenate(parts) for parts in (emb_all, labels_all, right_all))
    if ref is None:
        ref_emb, ref_desc = emb, {"images": "the scored images of the analysed configs", "n": int(emb.shape[0])}
    else:
        ref_suite = info.suite if own_ref else open_suite(ref[0], configs=tuple(ref[1])).suite
        unknown = [c for c in ref[1] if c not in ref_suite.configs]
        if unknown:
            raise BenchError(f"--whiten-reference: config {unknown[0]!r} is not in suite {ref_suite.suite_id} "
                             f"(has {', '.join(ref_suite.configs)})")
        ref_emb = np.concatenate([suite_image_embeddings(ref_suite, c, encoder, cache_dir=cache_dir, view=view)[1]
                                  for c in ref[1]])
        ref_desc = {"suite": ref_suite.suite_id, "manifest_sha256": ref_suite.manifest.sha256, "configs": ref[1],
                    "images": "every image of these configs", "n": int(ref_emb.shape[0])}
    if ref_emb.shape[0] < 2:
        raise BenchError(f"the whitening reference has {ref_emb.shape[0]} image(s); name a larger set with "
                         "--whiten-reference")
    white = Whitening.fit(ref_emb, whiten=options.whiten, normalize=options.normalize)
    text_cache: dict[str, np.ndarray] = {}

    def encode_text(texts: list[str]) -> np.ndarray:
        todo = [t for t in texts if t not in text_cache]
        for a in range(0, len(todo), 256):
            for t, e in zip(todo[a:a + 256], encoder.encode_texts(todo[a:a + 256])):
                text_cache[t] = e
        return np.stack([text_cache[t] for t in texts])

    wanted = sorted(set(labels.tolist()) if classes is None else set(classes))
    out = []
    for y in tqdm(wanted, desc="classes", disable=not progress, leave=False):
        sel = np.flatnonzero(labels == y)
        if sel.size == 0:
            continue
        d = class_direction(y, [ids_all[i] for i in sel], emb[sel], right[sel], white, options, encode_text=encode_text)
        out.append({**asdict(d), "wnid": imagenet.wnids()[y], "name": imagenet.names()[y]})
    out.sort(key=lambda d: -(d["strength"] if d["strength"] is not None else -1))
    report = {
        "kind": "genshift-diagnose", "schema_version": 1, "result": str(path), "model": result["model"]["id"],
        "suite": {k: result["suite"][k] for k in ("id", "manifest_sha256")}, "configs": configs,
        "criterion": criterion, "clip": encoder.model_id, "options": asdict(options),
        "embedding": {"image_view": asdict(view), "precision": encoder.resolved_precision()},
        "whitening_reference": ref_desc,
        "n_images": int(labels.size), "classes": out,
    }
    report["thumbnails"] = diagnose_report.thumbnails(info.suite, where, out)
    out_path = path.parent / diagnose_report.REPORT
    atomic_write_json(out_path, report)
    diagnose_report.write_html(report, path.parent / diagnose_report.HTML_REPORT)
    return report, out_path
