"""``bench verify``: check a result against the suite it claims and, with ``recheck``, against the model.

A result is never checked only against itself (a forger can recompute every hash and metric). The checks in
order: ``docs/results.md``, "Verification"; the re-check's sample and guarantee: ``docs/leaderboard.md``,
"What verified guarantees". A failure says how many rows disagree, never which.
"""

from __future__ import annotations

import bisect
import io
import itertools
import json
import math
import secrets
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from genshift.errors import BenchError, IntegrityError, one_line
from genshift.eval import results, suite_trust
from genshift.eval.predictions import BASE_COLUMNS, first_per_class, read_predictions, topk_matrix
from genshift.eval.predictions import schema as predictions_schema
from genshift.eval.scoring import ScoringOptions, score
from genshift.eval.suite_trust import SuiteRef, TrustedSuites, hub_manifest, open_ref
from genshift.fsutil import read_limited, sha256_bytes
from genshift.hub import EVAL_YAML, MAX_EVAL_YAML_BYTES, check_eval_yaml
from genshift.hubio import _unreachable
from genshift.identity import timm_name
from genshift.imagenet import NUM_CLASSES
from genshift.pixels import to_rgb
from genshift.suite_format import LocalSuite, read_row_group, rows_digest_table
from genshift.suites import SUITES, construction_models, declared_scoring, recorded_data_config

MAX_PROBLEMS = 20
DETECT_FRACTION = 0.005    # the guarantee: a result with at least this fraction of its rows altered ...
DETECT_PROBABILITY = 0.99  # ... is caught by a default re-check with at least this probability
RECHECK_BATCH = 32         # images per forward pass of a re-check (its memory bound)


@dataclass
class VerifyReport:
    path: Path
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    result: dict | None = None
    result_sha256: str = ""
    predictions_sha256: dict[str, str] = field(default_factory=dict)  # path -> sha256 of the file as checked
    suite: SuiteRef | None = None          # what the predictions were checked against
    rows_digests: dict[str, str] = field(default_factory=dict)
    recheck: dict | None = None            # {"n", "N", "seed", "seed_policy", "guarantee", "disagreeing"}
    tables: dict = field(default_factory=dict, repr=False)  # config -> predictions table, as hashed and checked

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def suite_checked(self) -> bool:
        return self.suite is not None and bool(self.rows_digests)


def result_path(path: str | Path) -> Path:
    p = Path(path)
    return p / results.RESULT_FILE if p.is_dir() else p


def verify_result(path: str | Path, *, recheck: int | str | None = None, suite: str | None = None,
                  suites: TrustedSuites | None = None, mask: str | None = None, checkpoint: str | None = None,
                  device: str = "cpu", seed: int | None = None, prob_tol: float = 1e-3, batch_size: int = RECHECK_BATCH,
                  use_recorded_suite: bool = False, require_suite: bool = True, raw: bytes | None = None,
                  result: dict | None = None) -> VerifyReport:
    """Verify one result; ``IntegrityError`` when the result file is unreadable or breaks the schema, any other
    problem listed in the report.

    ``suite``/``suites``: trust roots (default: the registry's pinned manifests). ``use_recorded_suite`` (one's
    own result: plain ``bench verify``, ``bench submit``) falls back to the suite the result records, which is
    not a trust root. ``recheck``: ``"auto"`` (the guaranteed sample), ``"all"`` or a number of rows.
    ``require_suite=False`` (the store without ``--suites``): a suite not found is no problem
    (``report.suite_checked`` is False). ``raw``, ``result``: the file's bytes and their ``parse_result``, done
    by the caller already.
    """
    path = result_path(path)
    raw = results.read_result_bytes(path) if raw is None else raw
    result = results.parse_result(raw, where=str(path)) if result is None else result
    report = VerifyReport(path, result=result, result_sha256=sha256_bytes(raw))
    tables = report.tables = check_predictions_files(path.parent, result, report)
    complete = len(tables) == len(result["predictions"])

    ref, why = find_suite(result, suite=suite, suites=suites, use_recorded=use_recorded_suite, mask=mask)
    if ref is None:
        if require_suite:
            report.problems.append(f"the predictions could not be checked against the suite: {why}")
    else:
        report.suite = ref
        if complete:
            report.problems += check_against_suite(result, tables, ref, report)

    want = results.config_hash(result["model"], result["suite"], result["protocol"], result["data_config"])
    if want != result["config_hash"]:
        report.problems.append(f"config_hash {result['config_hash'][:12]}… does not match the recorded model, "
                               f"suite and protocol ({want[:12]}…)")
    report.checked.append("config hash")

    if complete:
        try:
            options = ScoringOptions(**result["protocol"]["scoring"])
            recomputed = score(result["suite"]["metric_family"], tables, options)
        except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError) as e:
            report.problems.append(f"the metrics could not be recomputed from the predictions ({type(e).__name__}: "
                                   f"{str(e)[:200]})")
        else:
            diffs = compare(result["metrics"], recomputed, "metrics")
            report.problems += _capped(diffs, "metric differences")
            report.checked.append("every metric recomputed from the predictions")
    if recheck and not report.problems:
        report.problems += _recheck(result, tables, report, recheck=recheck, suite=suite, mask=mask,
                                    checkpoint=checkpoint, device=device, seed=seed, prob_tol=prob_tol,
                                    trusted_only=not use_recorded_suite, batch_size=batch_size)
    return report


def _capped(problems: list[str], what: str) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more {what}"]


def check_predictions_files(base: Path, result: dict, report: VerifyReport) -> dict[str, pa.Table]:
    """Hash, read and check each predictions file; the tables that passed, by config. Each file is read once:
    the bytes hashed are the bytes parsed and scored."""
    tables = {}
    for entry in result["predictions"]:
        rel = entry["path"]
        f = base / rel
        if not f.is_file():  # a regular file (or a link to one: Hub snapshots link to blobs); never a device or fifo
            report.problems.append(f"{rel} is missing")
            continue
        try:  # at most MAX_PREDICTIONS_BYTES + 1 bytes are read, whatever the file's size
            data = read_limited(f, max_bytes=results.MAX_PREDICTIONS_BYTES, what="predictions file")
            report.predictions_sha256[rel] = digest = sha256_bytes(data)
            if digest != entry["sha256"]:
                raise IntegrityError(f"{rel} sha256 {digest[:12]}… differs from the result's "
                                     f"{entry['sha256'][:12]}… (file replaced or tampered)")
            table = read_predictions(f, data=data)
            if table.num_rows != entry["rows"]:
                raise IntegrityError(f"{rel} has {table.num_rows} rows, the result says {entry['rows']}")
        except IntegrityError as e:
            report.problems.append(str(e))
            continue
        problems = check_rows(table, topk=min(result["protocol"]["topk"], NUM_CLASSES), where=rel)
        if problems:
            report.problems += _capped(problems, f"row problems in {rel}")
            continue
        tables[entry["config"]] = table
    report.checked.append(f"{len(tables)}/{len(result['predictions'])} predictions files (sha256, rows, schema, "
                          "each row's consistency)")
    return tables


def check_rows(table: pa.Table, *, topk: int, where: str, tol: float = 1e-6) -> list[str]:
    """Schema and internal consistency of a predictions table (no model, no suite needed)."""
    want = predictions_schema(topk)
    problems = []
    for name in BASE_COLUMNS:
        got = table.schema.field(name).type
        if got != want.field(name).type:
            problems.append(f"{where}: column {name!r} has type {got}, expected {want.field(name).type}")
        elif not want.field(name).nullable and table[name].null_count:
            problems.append(f"{where}: column {name!r} has {table[name].null_count} null value(s)")
    if problems:
        return problems
    ids = table["image_id"].to_pylist()
    if any(not a < b for a, b in zip(ids, ids[1:])):  # image ids are never named: what a submitter sees says how many
        return [f"{where}: image_id is not strictly increasing (predictions are one row per image, sorted by image_id)"]
    labels, top, probs, tp, tr = _arrays(table)

    def bad(mask: np.ndarray, what: str) -> None:
        if mask.any():
            problems.append(f"{where}: {int(mask.sum())} row(s) {what}")

    bad((labels < 0) | (labels >= NUM_CLASSES), "have a label outside [0, 1000)")
    bad(((top < 0) | (top >= NUM_CLASSES)).any(axis=1), "have a top-k class outside [0, 1000)")
    bad((np.diff(np.sort(top, axis=1), axis=1) == 0).any(axis=1), "repeat a class in their top-k")
    bad(~np.isfinite(probs).all(axis=1) | (probs < 0).any(axis=1) | (probs > 1).any(axis=1),
        "have a top-k probability outside [0, 1]")
    bad((np.diff(probs, axis=1) > 0).any(axis=1), "have top-k probabilities that are not in descending order")
    bad(probs.sum(axis=1) > 1 + 1e-3, "have top-k probabilities summing to more than 1")
    bad(~np.isfinite(tp) | (tp < 0) | (tp > 1), "have true_prob outside [0, 1]")
    bad((tr < 0) | (tr >= NUM_CLASSES), "have true_rank outside [0, 1000)")
    if problems:
        return problems
    hit = top == labels[:, None]
    found = hit.any(axis=1)
    pos = hit.argmax(axis=1)
    p_at = probs[np.arange(len(ids)), pos]
    # one order for both (genshift.eval.inference.rank_classes): probability descending, ties by class index
    bad(((np.diff(probs, axis=1) == 0) & (np.diff(top, axis=1) < 0)).any(axis=1),
        "list tied top-k classes out of class-index order")
    # found in the top-k: true_prob is the stored probability there, true_rank its position (ties never
    # counted in the true class's favour, so true_rank < k exactly when the label is in the top k)
    bad(found & (np.abs(tp - p_at) > tol), "have true_prob different from the top-k probability of the label")
    bad(found & (tr != pos), "have true_rank different from the label's position in the top-k")
    bad(~found & (tr < topk), "have true_rank inside the top-k but the label is not there")
    # not in the top-k: the label is at most as probable as the last one, ranks at least after the larger ones
    bad(~found & (tp > probs[:, -1] + tol),
        "have true_prob above the last top-k probability, yet the label is not in the top-k")
    bad(~found & (tp > 1 - probs.sum(axis=1) + 1e-3),
        "have true_prob larger than the probability left outside the top-k")
    return problems


def find_suite(result: dict, *, suite: str | None = None, suites: TrustedSuites | None = None,
               use_recorded: bool = False, mask: str | None = None) -> tuple[SuiteRef | None, str]:
    """The manifest to check ``result`` against, or ``(None, why not)`` (``genshift.eval.suite_trust``)."""
    rec = result["suite"]
    if suite is not None:
        try:
            return open_ref(suite, trusted=True, mask=mask), ""
        except BenchError as e:
            return None, f"--suite {suite}: {e}"
    trusted = suites if suites is not None else TrustedSuites(registry=True, download=True)
    ref = trusted.lookup(rec)
    if ref is not None:
        return ref, ""
    src = rec.get("source")
    if use_recorded and isinstance(src, str):
        if rec.get("repo_id") and rec.get("revision") and not Path(src).exists():  # the manifest alone, if it is one
            ref = hub_manifest(rec["repo_id"], rec["revision"], download=True, trusted=False)
            if ref is not None and ref.sha256 == rec["manifest_sha256"]:
                return ref, ""
        # as recorded (folder, registry id or Hub repo at its revision; an upstream ImageNet* mask too);
        # what cannot be opened is the user's to fix (--suite, --mask): one error line
        info = suite_trust.reopen_suite(result, mask=mask, configs=tuple(rec["configs"]))
        return SuiteRef(info.suite.manifest, f"suite {src[:200]} (as recorded)", False, info.suite), ""
    return None, (f"no trusted manifest with sha256 {rec['manifest_sha256'][:12]}… (suite {rec['id']!r}); pass the "
                  "suite with --suite PATH|ID or a folder of trusted manifests with --suites DIR")


def check_against_suite(result: dict, tables: dict[str, pa.Table], ref: SuiteRef, report: VerifyReport) -> list[str]:
    """Suite identity, rows digests, counts and flags recomputed from the suite's manifest (and rows)."""
    rec, m = result["suite"], ref.manifest
    trust = "" if ref.trusted else " (the folder recorded in the result: not a trust root; use --suite to choose)"
    if m.sha256 != rec["manifest_sha256"]:
        return [f"the result was made on suite manifest {rec['manifest_sha256'][:12]}…, {ref.origin} has "
                f"{m.sha256[:12]}…; pass the suite the result claims with --suite"]
    problems = []
    if rec["id"] != m.suite_id:
        problems.append(f"suite.id {rec['id'][:80]!r} is not the manifest's suite id {m.suite_id!r}")
    if rec.get("suite_version") not in (None, m.suite_version):
        problems.append(f"suite.suite_version {rec['suite_version'][:40]!r} is not the manifest's {m.suite_version!r}")
    unknown = [c for c in rec["configs"] if c not in m.configs]
    if unknown:
        return problems + [f"configs {unknown[:5]} are not in the suite (it has {sorted(m.configs)[:10]})"]
    protocol = result["protocol"]
    limited = protocol["limit_per_class"] is not None
    for cfg in rec["configs"]:
        t, stored, info = tables[cfg], result["counts"][cfg], m.configs[cfg]
        rows = ref.rows(cfg) if (limited or stored["skipped_bad"] or t.num_rows != info.rows) else None
        if rows is None:
            if limited or stored["skipped_bad"]:
                problems.append(f"{cfg}: a run with --limit-per-class or skipped images can only be checked with the "
                                "suite's rows; pass the suite folder with --suite")
                continue
            want = ref.rows_digest(cfg)
            if want is None:
                problems.append(f"{cfg}: {ref.origin} records no rows digest (format 1); pass the suite folder")
                continue
            got = rows_digest_table(t)
            if got != want:
                problems.append(f"{cfg}: the predictions' (image_id, label, keep) rows do not reproduce the suite's "
                                f"rows digest ({got[:12]}… vs {want[:12]}…): rows dropped, added, duplicated or "
                                "relabelled")
                continue
            report.rows_digests[cfg] = want
            skipped = 0
        else:
            pids, plabels, pkeeps = (t[c].to_pylist() for c in ("image_id", "label", "keep"))
            sids, slabels, skeeps = rows
            suite_rows = dict(zip(sids, zip(slabels, skeeps)))  # image ids unique: the suite's rows are verified
            expected = first_per_class(sids, slabels, protocol["limit_per_class"]) if limited else set(sids)
            extra = [i for i in pids if i not in expected]
            wrong = [i for i, lab, k in zip(pids, plabels, pkeeps) if i in suite_rows and suite_rows[i] != (lab, k)]
            if extra or wrong:
                selection = " selection" if limited else ""
                problems.append(f"{cfg}: {len(extra)} predicted image(s) not in the suite{selection} "
                                f"and {len(wrong)} with another label/keep than the suite")
                continue
            missing = expected - set(pids)
            skipped, listed = len(missing), stored["skipped_bad_ids"]
            if skipped and not protocol["skip_bad_images"]:
                problems.append(f"{cfg}: {skipped} image(s) of the suite are missing from the predictions")
                continue
            if not (set(listed) <= missing
                    and len(set(listed)) == len(listed) == min(skipped, results.MAX_SKIPPED_IDS)):
                problems.append(f"{cfg}: counts.{cfg}.skipped_bad_ids does not list the images missing from the "
                                "predictions")
            report.rows_digests[cfg] = rows_digest_table(t)
        recomputed = {"total": info.rows, "kept": info.kept, "predicted": t.num_rows, "skipped_bad": skipped}
        problems += [f"counts.{cfg}.{k} is {stored[k]}, recomputed {v}" for k, v in recomputed.items()
                     if stored[k] != v]
    spec = SUITES.get(rec["id"]) if rec["id"] in SUITES else None
    model = result["model"]
    flags = {
        "unpinned_suite": not rec["pinned"],
        "construction_model": suite_trust.is_construction_model(model.get("declared_name") or model["id"],
                                                               construction_models(m, spec), model["weights_sha256"]),
        "partial": limited or set(rec["configs"]) != set(m.configs),
        "skipped_bad_images": any(result["counts"][c]["skipped_bad"] > 0 for c in rec["configs"]),
    }
    problems += [f"flags.{k} is {result['flags'][k]}, recomputed {v}" for k, v in flags.items()
                 if result["flags"][k] != v]
    try:
        family = declared_scoring(m, spec)[0]
    except IntegrityError as e:
        family = None
        problems.append(str(e))
    if family is not None and rec["metric_family"] != family:
        problems.append(f"suite.metric_family is {rec['metric_family']!r}; suite {rec['id']!r} is scored as {family!r}")
    if rec.get("repo_id") is None and not rec["pinned"]:
        problems.append("suite.pinned is false for a local suite folder (pinned by its manifest hash)")
    if rec.get("repo_id") is None and rec.get("revision") is not None:
        problems.append("suite.revision is set but suite.repo_id is not (a local suite has no Hub revision)")
    if rec["pinned"] and rec.get("repo_id") is not None and rec.get("revision") is None:
        problems.append("suite.pinned is true but no suite.revision (a 40-character sha) is recorded")
    report.checked.append(f"predictions against the suite ({len(report.rows_digests)}/{len(rec['configs'])} configs' "
                          f"rows; counts and flags recomputed) from {ref.origin}{trust}")
    return problems


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
    if isinstance(stored, bool) or isinstance(recomputed, bool):  # JSON false is not the number 0
        if type(stored) is type(recomputed) and stored == recomputed:
            return []
    elif isinstance(stored, (int, float)) and isinstance(recomputed, (int, float)):
        if math.isclose(stored, recomputed, rel_tol=rel, abs_tol=1e-12):
            return []
    elif stored == recomputed:
        return []
    return [f"{where}: stored {str(stored)[:80]}, recomputed {str(recomputed)[:80]}"]


def miss_probability(total: int, altered: int, n: int) -> float:
    """The chance that ``n`` rows drawn without replacement from ``total`` miss all ``altered`` ones:
    the hypergeometric P(X = 0) = prod_{i<n} (total - altered - i) / (total - i)."""
    i = np.arange(min(n, total))
    return float(np.prod(np.maximum(total - altered - i, 0) / (total - i)))


def sample_size(total: int, *, fraction: float = DETECT_FRACTION, probability: float = DETECT_PROBABILITY) -> int:
    """The fewest rows to draw from ``total`` so that a result with at least ``fraction`` of them altered
    (K = ceil(fraction * total), at least 1) is caught with ``probability``: the least n with
    :func:`miss_probability` <= 1 - probability: nearly every row of a small suite (one altered row
    in 200 is caught by 198 draws of 200 with probability 0.99).

    >>> sample_size(10**6), sample_size(10_000), sample_size(200)
    (919, 878, 198)
    """
    if total <= 0:
        return 0
    altered = max(1, math.ceil(round(fraction * total, 9)))
    # drawing with replacement misses more often: its n, log(1 - p) / log(1 - f), always suffices
    i = np.arange(min(total, math.ceil(math.log(1 - probability) / math.log(1 - fraction))))
    miss = np.cumprod(np.maximum(total - altered - i, 0) / (total - i))
    return int(np.argmax(miss <= 1 - probability)) + 1 if (miss <= 1 - probability).any() else len(i)


def detected_fraction(total: int, n: int, *, probability: float = DETECT_PROBABILITY) -> float:
    """The smallest fraction of altered rows that ``n`` draws from ``total`` catch with ``probability``."""
    # miss_probability falls as the altered count grows; at total it is 0
    caught = bisect.bisect_left(range(1, total), True, key=lambda k: miss_probability(total, k, n) <= 1 - probability)
    return (caught + 1) / total


def draw(total: int, n: int, seed: int) -> np.ndarray:
    """Which of ``total`` pool rows a re-check re-runs: ``min(n, total)`` distinct indices, sorted (numpy's
    PCG64 seeded with ``seed``). The one draw of ``bench verify`` and ``bench review``."""
    return np.sort(np.random.default_rng(seed).choice(total, size=min(n, total), replace=False))


def recheck_count(recheck: int | str, total: int) -> int:
    """How many of ``total`` rows a re-check draws: ``"auto"`` the guaranteed :func:`sample_size`,
    ``"all"`` every row, a number at most ``total``."""
    if recheck == "auto":
        return sample_size(total)
    if recheck == "all":
        return total
    if isinstance(recheck, bool) or not isinstance(recheck, int) or recheck < 1:
        raise BenchError(f"recheck must be a number of images (at least 1), 'auto' or 'all', got {recheck!r}")
    return min(recheck, total)


def _recheck(result: dict, tables: dict, report: VerifyReport, *, recheck: int | str, suite: str | None,
             mask: str | None, checkpoint: str | None, device: str, seed: int | None, prob_tol: float,
             trusted_only: bool, batch_size: int) -> list[str]:
    import torch

    local = _images_of(result, report, suite=suite, mask=mask, trusted_only=trusted_only, configs=tuple(tables))
    if local.manifest.sha256 != result["suite"]["manifest_sha256"]:
        return [f"the suite's manifest {local.manifest.sha256[:12]}… is not the result's; pass the right suite with "
                "--suite"]
    local.verify(sorted(tables))  # images are read only from files that match the manifest
    clf = _load_recorded_model(result["model"], checkpoint=checkpoint, device=device,
                               preprocess=result["protocol"].get("preprocess", "timm"),
                               data_config=result["protocol"].get("data_config"))
    loaded = {**clf.describe(), "data_config": clf.data_config}  # the model as it loads, not as the result says
    stored = {**result["model"], "data_config": result["data_config"]}
    differ = [k for k in sorted(set(loaded) | set(stored)) if json.loads(json.dumps(loaded.get(k))) != stored.get(k)]
    if differ:
        return [f"the model loads with other {', '.join(differ)} than the result records"]

    # the pool is the suite's rows (not the predictions'), so an image dropped from the predictions can be drawn
    pool = []
    limit = result["protocol"]["limit_per_class"]
    for cfg in sorted(tables):
        t = local.read_columns(cfg, ["image_id", "label"])
        ids = t["image_id"].to_pylist()
        if limit:
            ids = first_per_class(ids, t["label"].to_pylist(), limit)
        pool += [(cfg, i) for i in sorted(ids)]
    given = seed is not None
    seed = int(seed) if given else secrets.randbits(63)
    picks = [pool[i] for i in draw(len(pool), recheck_count(recheck, len(pool)), seed)]
    kinds: list[str] = []  # one per disagreeing row; which rows is never said
    for cfg in sorted({c for c, _ in picks}):
        t = tables[cfg]
        index = {iid: r for r, iid in enumerate(t["image_id"].to_pylist())}
        wanted = {i for c, i in picks if c == cfg} - set(result["counts"][cfg]["skipped_bad_ids"])
        kinds += ["in the suite but missing from the predictions"] * len(wanted - set(index))

        images = _decoded(_stream_images(local, cfg, wanted & set(index)), clf.transform, kinds)
        while batch := list(itertools.islice(images, batch_size)):
            ids, xs = zip(*batch)
            with torch.inference_mode():
                probs = clf.model(torch.stack(xs).to(device)).float().softmax(-1).cpu().numpy()
            kinds += row_disagreements(probs, t.take([index[i] for i in ids]), tol=prob_tol)
    report.recheck = {"n": len(picks), "N": len(pool), "seed": seed, "seed_policy": "given" if given else "fresh",
                      "guarantee": {"fraction": detected_fraction(len(pool), len(picks)),
                                    "probability": DETECT_PROBABILITY},
                      "disagreeing": len(kinds)}
    report.checked.append(f"{len(picks)} of {len(pool)} suite rows drawn (seed {'given' if given else 'fresh'}) re-run "
                          f"through the model; whole rows compared")
    if not kinds:
        return []
    counts = ", ".join(f"{c} {k}" for k, c in sorted(Counter(kinds).items(), key=lambda kc: -kc[1]))
    return [f"{len(kinds)} of the {len(picks)} re-run rows disagree with the stored predictions ({counts})"]


def _images_of(result: dict, report: VerifyReport, *, suite: str | None, mask: str | None, trusted_only: bool,
               configs: tuple):
    """The suite whose images are re-run: the trusted one the rows were checked against (its folder, or its
    registry id opened here); never a path a result records unless ``trusted_only`` is off (one's own result)."""
    ref = report.suite
    if ref is not None and ref.local is not None:
        return ref.local
    if ref is not None and ref.trusted:
        if ref.opens is None:
            raise BenchError(f"the trusted {ref.origin} is a manifest only, without images; pass the suite's folder or "
                             "registry id with --suite to re-run them")
        return suite_trust.open_suite(ref.opens, mask=mask, configs=configs).suite
    if trusted_only:
        raise BenchError("no trusted copy of the suite to re-run images from; pass it with --suite")
    try:
        return suite_trust.reopen_suite(result, suite=suite, mask=mask, configs=configs).suite
    except IntegrityError as e:
        raise BenchError(str(e)) from None


def _load_recorded_model(m: dict, *, checkpoint: str | None, device: str, preprocess: str,
                         data_config: str | None = None):
    """The model a result records, from where it says its weights came: Hub weights from the Hub at the
    recorded revision (never from ``checkpoint``), local weights from ``checkpoint`` (never from a Hub repo)."""
    from genshift.eval.models import load_classifier

    if m["source"] == "hf-hub":
        if checkpoint:
            raise BenchError(f"{m['id']} was scored with Hub weights: they are re-run from the Hub at the recorded "
                             "revision, never from a --checkpoint; drop --checkpoint")
        name = f"hf-hub:{m['id']}@{m['weights_revision']}"
    elif m["source"] == "checkpoint":
        if not checkpoint:
            raise BenchError("this result used local weights; pass them with --checkpoint to re-run images (local "
                             "weights are never fetched from a Hub repo)")
        name = m.get("declared_name") or m.get("architecture") or ""
    else:
        raise BenchError(f"a result of {m['source']} weights cannot be re-run: only the process that scored it had "
                         "them")
    recorded = None
    if data_config is not None:  # a population's record of the paper's timm (genshift.suites)
        recorded = recorded_data_config(timm_name(m.get("declared_name") or m["id"]), data_config)
    try:
        return load_classifier(name, checkpoint=checkpoint if m["source"] == "checkpoint" else None, device=device,
                               remap_by_order=True, checkpoint_weights=m.get("checkpoint_weights") or "model",
                               preprocess=preprocess, data_config=recorded)
    except Exception as e:
        # the network, the Hub's answers and memory are the checker's own trouble; anything else is the model's
        if isinstance(e, (BenchError, OSError, MemoryError)) or _unreachable(e) or \
                type(e).__name__ == "OutOfMemoryError":
            raise
        raise BenchError(f"model {name} cannot be loaded ({type(e).__name__}: {one_line(e, 200)}); it must load with "
                         "timm at its recorded weights") from None


def _arrays(table: pa.Table) -> tuple[np.ndarray, ...]:
    """``(label, topk_idx, topk_prob, true_prob, true_rank)`` of a predictions table as numpy arrays."""
    top = topk_matrix(table).astype(np.int64)
    probs = table["topk_prob"].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, top.shape[1])
    return (table["label"].to_numpy().astype(np.int64), top, probs, table["true_prob"].to_numpy(zero_copy_only=False),
            table["true_rank"].to_numpy(zero_copy_only=False).astype(np.int64))


def row_disagreements(probs: np.ndarray, sub: pa.Table, *, tol: float) -> list[str]:
    """What disagrees, one entry per disagreeing row, between stored rows ``sub`` and re-run softmax outputs
    ``probs`` (n, 1000): the true-class probability, a top-k probability, a class that belongs in the top-k
    but is not stored there, the true rank (each within ``tol``; ties within ``tol`` accepted)."""
    labels, top, tprobs, tp, tr = _arrays(sub)
    out = []
    for p, y, t, tpr, tp_j, tr_j in zip(probs, labels, top, tprobs, tp, tr):
        others = np.delete(p, t)
        if abs(p[y] - tp_j) > tol:
            out.append("true-class probability")
        elif (np.abs(p[t] - tpr) > tol).any():
            out.append("top-k probability")
        elif others.size and others.max() > tpr[-1] + tol:
            out.append("class missing from the top-k")
        elif not (p > p[y] + tol).sum() <= tr_j <= (p > p[y] - tol).sum():
            out.append("true rank")
    return out


def _decoded(stream, transform, failed: list[str]):
    """``(image_id, transformed image)`` for each ``(image_id, image bytes)`` of ``stream``; an image that does not
    decode is one entry in ``failed``."""
    from PIL import Image

    for iid, data in stream:
        try:  # sides checked from the header by to_rgb before any decode (genshift.pixels)
            with Image.open(io.BytesIO(data)) as im:
                x = transform(to_rgb(im))
        except Exception:  # noqa: BLE001 - a stored prediction for an image that cannot be decoded
            failed.append("a stored prediction for an image that does not decode")
            continue
        yield iid, x


def _stream_images(suite, config: str, ids: set[str]):
    """``(image_id, image bytes)`` of the rows ``ids`` of a config, one row group at a time (groups holding
    none of them are not read), so memory stays bounded by a row group whatever is re-run."""
    for group in suite.row_groups(config):
        names = read_row_group(suite.root, group, ["image_id"])["image_id"].to_pylist()
        if ids.isdisjoint(names):
            continue
        images = read_row_group(suite.root, group, ["image"])["image"].combine_chunks().field("bytes")
        for i, iid in enumerate(names):
            if iid in ids:
                yield iid, images[i].as_py()


def verify_suite_dir(path: str | Path) -> str:
    """Verify a suite folder against its manifest (files, rows, rows digests) and require its
    dataset card (part of the format); returns a one-line summary."""
    suite = LocalSuite.open(path)
    suite.require_card()
    suite.verify()
    m = suite.manifest
    declared = Path(suite.root) / EVAL_YAML  # the suite's Hub benchmark declaration, checked when present
    if declared.is_file():
        doc = check_eval_yaml(read_limited(declared, max_bytes=MAX_EVAL_YAML_BYTES, what=EVAL_YAML), m,
                              where=str(declared))
        state = f"{EVAL_YAML} declares its {len(doc['tasks'])} tasks"
    else:
        state = f"no {EVAL_YAML} yet (`bench publish` writes it)"
    return (f"{path}: suite {m.suite_id} v{m.suite_version} (format {m.format_version}), {len(m.configs)} configs, "
            f"{sum(c.rows for c in m.configs.values())} rows, {len(m.files)} files and every row verified, card "
            f"present, {state}; manifest sha256 {m.sha256}")
