"""Results as hostile input: forged predictions, stamps, schema violations, swapped files, fuzzing.

Every forgery here is done the way a forger would: the predictions are edited, then the sha256,
row counts, counts and metrics in ``result.json`` are recomputed so the result agrees with itself.
Only checks against the suite (rows digest), each row's consistency, the re-run and the signature
can catch them.
"""

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genshift.cli import main
from genshift.errors import BenchError, IntegrityError
from genshift.eval import stamps
from genshift.eval.predictions import read_predictions
from genshift.eval.results import config_hash
from genshift.eval.scoring import ScoringOptions, score
from genshift.eval.suite_trust import TrustedSuites
from genshift.eval.verify import draw, verify_result
from genshift.fsutil import canonical_json, sha256_file
from genshift.leaderboard.store import load_store


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_checkpoint):
    """One honest run of the tiny model on a 2-config suite (40 images each), made once per module."""
    from genshift import evaluate
    from genshift.synthetic import make_synthetic_suite

    root = tmp_path_factory.mktemp("made")
    make_synthetic_suite(root / "suite", configs=("base", "shifted"), classes=range(10), per_class=4, num_shards=2)
    path = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(root / "suite"), out=root / "runs",
                    batch_size=16, workers=0, compile="off", progress=False).path
    return root / "suite", path.parent


@pytest.fixture
def run(made, tmp_path):
    """A private copy of the honest run, inside a store folder ``tmp_path/store/<suite>/<model>``."""
    suite, run_dir = made
    dst = tmp_path / "store" / "toy" / run_dir.name
    shutil.copytree(run_dir, dst)
    return dst


@pytest.fixture(scope="module")
def trusted(made):
    return TrustedSuites.from_paths([made[0]], registry=False)


def forge(run_dir, config, edit):
    """Apply ``edit(table) -> table`` to a predictions file, then recompute everything the result
    derives from the predictions (sorted rows, sha256, rows, counts, metrics, config hash)."""
    f = run_dir / "predictions" / f"{config}.parquet"
    t = edit(pq.read_table(f))
    t = t.take(pc.sort_indices(t, [("image_id", "ascending")]))
    pq.write_table(t, f)
    rewrite(run_dir)


def rewrite(run_dir, change=None):
    path = run_dir / "result.json"
    r = json.loads(path.read_text())
    if change:
        change(r)
    tables = {}
    for p in r["predictions"]:
        f = run_dir / p["path"]
        tables[p["config"]] = read_predictions(f)
        p["sha256"], p["rows"] = sha256_file(f), tables[p["config"]].num_rows
        r["counts"][p["config"]].update(predicted=p["rows"])
    r["metrics"] = score(r["suite"]["metric_family"], tables, ScoringOptions(**r["protocol"]["scoring"]))
    r["config_hash"] = config_hash(r["model"], r["suite"], r["protocol"], r["data_config"])
    path.write_bytes(canonical_json(r))


def col(t, name, values):
    field = t.schema.field(name)
    return t.set_column(t.schema.get_field_index(name), field, pa.array(values, field.type))


def label_to_top1(t):
    top1 = np.array([r[0] for r in t["topk_idx"].to_pylist()])
    probs = np.array([r[0] for r in t["topk_prob"].to_pylist()], np.float32)
    t = col(t, "label", top1)
    t = col(t, "true_rank", np.zeros(t.num_rows, np.int32))
    return col(t, "true_prob", probs)


def label_first(t):
    """Every row made correct and still self-consistent: the label moved to the top of the top-k with the
    top probability (its classes shifted down). Keeps image_id/label/keep, so the rows digest holds."""
    idx = np.stack(t["topk_idx"].to_numpy(zero_copy_only=False)).astype(np.int64)
    lab = t["label"].to_numpy().astype(np.int64)
    new = np.empty_like(idx)
    for i in range(len(idx)):
        rest = [c for c in idx[i] if c != lab[i]]
        new[i] = [lab[i], *rest[:idx.shape[1] - 1]]
    k = idx.shape[1]
    t = t.set_column(t.schema.get_field_index("topk_idx"), "topk_idx",
                     pa.FixedSizeListArray.from_arrays(pa.array(new.ravel().astype(np.int16)), k))
    probs = np.array([r[0] for r in t["topk_prob"].to_pylist()], np.float32)
    t = col(t, "true_rank", np.zeros(t.num_rows, np.int32))
    return col(t, "true_prob", probs)


def wrong_rows(t):
    return np.flatnonzero(t["true_rank"].to_numpy() > 0)


FORGERIES = {
    "wrong rows dropped": lambda t: t.take(np.setdiff1d(np.arange(t.num_rows), wrong_rows(t)[:12])),
    "right rows duplicated x5": lambda t: pa.concat_tables(
        [t] + [t.take(np.flatnonzero(t["true_rank"].to_numpy() < 5))] * 5),
    "duplicates renamed": lambda t: pa.concat_tables([t, col(t.take(np.arange(8)), "image_id",
                                                             [f"zz/{i}" for i in range(8)])]),
    "true_rank set to 0": lambda t: col(t, "true_rank", np.zeros(t.num_rows, np.int32)),
    "label set to the top-1": label_to_top1,
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_predictions_are_rejected_by_verify_and_the_store(run, made, trusted, name, capsys):
    forge(run, "shifted", FORGERIES[name])
    rep = verify_result(run, suites=trusted)
    assert not rep.ok, name
    assert any("shifted" in p for p in rep.problems)
    # the CLI: exit 1, the mismatch named; with the recorded suite folder as well as with --suite
    assert main(["verify", str(run), "--suite", str(made[0])]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert main(["verify", str(run)]) == 1
    store = load_store(str(run.parent.parent), suites=[made[0]])
    assert not any(e.verified for e in store.entries)  # at most a community entry: no maintainer signed its record


def test_honest_result_verifies_against_the_suite_and_says_what_it_trusted(run, made, trusted, capsys):
    rep = verify_result(run, suites=trusted)
    assert rep.ok, rep.problems
    assert set(rep.rows_digests) == {"base", "shifted"} and rep.suite.trusted
    # without a trust root, plain verify uses the recorded folder and says it is not a trust root
    assert main(["verify", str(run)]) == 0
    assert "not a trust root" in capsys.readouterr().out
    store = load_store(str(run.parent.parent), suites=[made[0]])
    assert [e.status for e in store.entries] == ["accepted"]  # on trusted suite data, not verified (no record)


def test_unknown_suite_is_rejected_when_the_store_names_its_suites(run, tmp_path):
    from genshift.synthetic import make_synthetic_suite

    make_synthetic_suite(tmp_path / "other", suite_id="other", configs=("base",), classes=range(3), per_class=2)
    strict = load_store(str(run.parent.parent), suites=[tmp_path / "other"])
    assert not strict.entries and "does not trust" in strict.rejected[0].reason
    lax = load_store(str(run.parent.parent))  # no suites configured: shown, unverified
    assert lax.entries[0].status == "accepted" and not lax.entries[0].verified


def test_counts_flags_pinned_and_source_edits_are_found(run, trusted):
    edits = {
        "counts.shifted.total": lambda r: r["counts"]["shifted"].update(total=400),
        "flags.partial": lambda r: r["flags"].update(partial=True),
        "flags.unpinned_suite": lambda r: r["flags"].update(unpinned_suite=True),
        "suite.pinned": lambda r: r["suite"].update(pinned=False),
        "counts.base.kept": lambda r: r["counts"]["base"].update(kept=1),
    }
    original = (run / "result.json").read_bytes()
    for name, edit in edits.items():
        (run / "result.json").write_bytes(original)
        rewrite(run, edit)  # config hash recomputed too
        rep = verify_result(run, suites=trusted)
        assert not rep.ok, name
    (run / "result.json").write_bytes(original)
    r = json.loads(original)
    r["model"]["source"] = "random"
    r["model"]["weights_sha256"] = None
    (run / "result.json").write_bytes(canonical_json(r))
    rep = verify_result(run, suites=trusted)  # not recomputed by the forger: the config hash covers source
    assert not rep.ok and any("config_hash" in p for p in rep.problems)


def test_recheck_draws_from_the_suite_with_a_fresh_recorded_seed(run, made, tiny_checkpoint, tmp_path):
    key = tmp_path / "m.key"
    assert main(["keygen", str(key), "--name", "maintainer"]) == 0
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    seeds = []
    for _ in range(2):
        assert main(["verify", str(run), "--recheck", "3", "--checkpoint", str(tiny_checkpoint), "--suite",
                     str(made[0]), "--sign", str(key)]) == 0
        stamp = json.loads((run / "verification.json").read_text())["record"]
        seeds.append(stamp["recheck"]["seed"])
        assert stamp["recheck"]["n"] == 3 and stamp["recheck"]["N"] == 80 and "images" not in stamp["recheck"]
        assert stamp["recheck"]["seed_policy"] == "fresh" and stamp["recheck"]["disagreeing"] == 0
        assert stamp["files"] == {p: sha256_file(run / p) for p in
                                  ("result.json", "predictions/base.parquet", "predictions/shifted.parquet")}
        assert stamp["suite"]["rows_digests"].keys() == {"base", "shifted"}
    assert seeds[0] != seeds[1]
    # a given seed draws the same rows again (the draw is a function of the pool size, n and the seed)
    rep = verify_result(run, recheck=3, seed=seeds[0], checkpoint=str(tiny_checkpoint), suite=str(made[0]))
    assert rep.recheck["seed"] == seeds[0] and rep.recheck["seed_policy"] == "given"
    assert list(draw(80, 3, seeds[0])) == list(draw(80, 3, seeds[0])) != list(draw(80, 3, seeds[1]))


def test_recheck_catches_self_consistent_forgeries_with_real_weights(made, lite0_weights, tmp_path):
    """Real EfficientNet-Lite0 weights (peaked outputs, unlike a random tiny model): a forgery that keeps
    every row self-consistent and the rows digest intact is seen only by the re-run, which compares whole rows,
    and whose images are drawn from the suite, so rows dropped behind `skipped` counts are drawn too."""
    from genshift import evaluate

    suite = made[0]
    path = evaluate(f"tf_efficientnet_lite0={lite0_weights}", str(suite), out=tmp_path / "runs",
                    remap_by_order=True, configs=("shifted",), batch_size=40, workers=0, compile="off",
                    progress=False).path
    run = path.parent
    assert verify_result(run, recheck=3, checkpoint=lite0_weights, suite=str(suite)).ok
    honest = (run / "predictions" / "shifted.parquet").read_bytes()
    # most rows are wrong (ImageNet weights on synthetic images), so 10 drawn images hit forged rows
    assert json.loads((run / "result.json").read_text())["metrics"]["configs"]["shifted"]["acc1"]["value"] < 0.3
    forge(run, "shifted", label_first)  # digest, rows and metrics all consistent: acc@1 1.0
    assert json.loads((run / "result.json").read_text())["metrics"]["configs"]["shifted"]["acc1"]["value"] == 1.0
    assert verify_result(run, suite=str(suite)).ok  # nothing but a re-run can see this
    rep = verify_result(run, recheck=10, checkpoint=lite0_weights, suite=str(suite))
    assert not rep.ok and any("of the 10 re-run rows disagree" in p for p in rep.problems), rep.problems
    assert rep.recheck["n"] == 10 and isinstance(rep.recheck["seed"], int) and rep.recheck["disagreeing"] > 0

    # a forgery of one stored probability only (the row stays consistent): the whole-row comparison finds it
    (run / "predictions" / "shifted.parquet").write_bytes(honest)

    def nudge(t):
        probs = np.stack(t["topk_prob"].to_numpy(zero_copy_only=False))
        probs[:, -1] = probs[:, -1] / 2  # still descending, still in [0, 1]; true_prob/true_rank untouched
        tr = t["true_rank"].to_numpy()
        in_topk = tr < probs.shape[1]
        probs[in_topk, -1] = np.stack(t["topk_prob"].to_numpy(zero_copy_only=False))[in_topk, -1]
        topk_prob = pa.FixedSizeListArray.from_arrays(pa.array(probs.ravel().astype(np.float32)), probs.shape[1])
        return t.set_column(t.schema.get_field_index("topk_prob"), t.schema.field("topk_prob"), topk_prob)

    forge(run, "shifted", nudge)
    rep = verify_result(run, recheck=10, checkpoint=lite0_weights, suite=str(suite))
    assert not rep.ok and any("top-k probability" in p for p in rep.problems), rep.problems


def test_signing_refuses_an_untrusted_suite_and_an_unsigned_stamp(run, tiny_checkpoint, tmp_path, capsys):
    key = tmp_path / "m.key"
    stamps.generate_key(key)
    # no --suite/--suites: the recorded folder is not a trust root, so nothing gets signed
    assert main(["verify", str(run), "--recheck", "2", "--checkpoint", str(tiny_checkpoint), "--sign", str(key)]) == 1
    assert not (run / "verification.json").exists()
    with pytest.raises(SystemExit):  # --stamp is gone: an unsigned stamp never verifies
        main(["verify", str(run), "--recheck", "2", "--stamp"])
    assert "unrecognized arguments: --stamp" in capsys.readouterr().err


def _entry(store_root, **kw):
    store = load_store(str(store_root), **kw)
    return (store.entries or store.rejected)[0]


def _signed_stamp(run, key_path, **over):
    r = json.loads((run / "result.json").read_bytes())
    result_sha256 = sha256_file(run / "result.json")
    predictions_sha256 = {p["path"]: sha256_file(run / p["path"]) for p in r["predictions"]}
    body = {**stamps.build_record(r, result_sha256=result_sha256, predictions_sha256=predictions_sha256),
            "recheck": {"n": 5, "seed": 7, "images": []}, "verified_at": "2026-11-24T00:00:00+00:00", **over}
    return stamps.sign(body, stamps.load_private_key(key_path)) if key_path else body


def test_stamps_count_only_signed_by_a_trusted_key_for_the_files_as_they_are(run, made, tmp_path):
    root = run.parent.parent
    good, other = tmp_path / "good.key", tmp_path / "other.key"
    stamps.generate_key(good)
    stamps.generate_key(other)
    trusted = f"{good}.pub"
    sp = run / "verification.json"

    sp.write_bytes(canonical_json(_signed_stamp(run, None)))  # hand-written, right hashes
    e = _entry(root, trusted_keys=trusted, suites=[made[0]])
    assert e.status == "accepted" and "not signed" in e.note
    sp.write_bytes(canonical_json({"ok": True, "result_sha256": sha256_file(run / "result.json"), "recheck": 20}))
    assert not _entry(root, trusted_keys=trusted).verified  # the old unsigned format
    sp.write_bytes(_signed_stamp(run, other))
    e = _entry(root, trusted_keys=trusted, suites=[made[0]])
    assert not e.verified and "does not trust" in e.note
    forged = _signed_stamp(run, good).replace(b'"n": 5,', b'"n": 500,')  # edited after signing
    assert b'"n": 500,' in forged
    sp.write_bytes(forged)
    e = _entry(root, trusted_keys=trusted, suites=[made[0]])
    assert not e.verified and "does not match its content" in e.note
    sp.write_bytes(_signed_stamp(run, good))
    e = _entry(root, trusted_keys=trusted, suites=[made[0]])
    assert e.verified and e.stamp["recheck"]["n"] == 5
    assert not _entry(root).verified  # no trusted keys configured: nothing is verified

    # tamper with the result after signing (a field no check recomputes): the badge goes
    r = json.loads((run / "result.json").read_text())
    r["notes"] = "edited after verification"
    (run / "result.json").write_bytes(canonical_json(r))
    e = _entry(root, trusted_keys=trusted, suites=[made[0]])
    assert e.status == "accepted" and not e.verified and "stale" in e.note


def test_same_size_same_mtime_predictions_swap_is_detected(run, made):
    root = run.parent.parent
    store = load_store(str(root), suites=[made[0]])
    entry = store.entries[0]
    assert entry.status == "accepted"
    f = run / "predictions" / "shifted.parquet"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    # a view hashes the file against the entry's record before it reads it (the page then marks it stale)
    with pytest.raises(IntegrityError, match="not the file its record names"):
        entry.check()
    with pytest.raises(IntegrityError, match="stale"):
        entry.read_predictions("shifted")


def test_int_model_id_is_rejected_with_a_reason_everywhere(run, made, capsys):
    from genshift.leaderboard.submit import submit

    why = "field 'model.id': input should be a valid string"
    r = json.loads((run / "result.json").read_text())
    r["model"]["id"] = 12345
    (run / "result.json").write_bytes(canonical_json(r))
    with pytest.raises(IntegrityError, match=why):
        verify_result(run)
    assert main(["verify", str(run)]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: ") and why in err and "Traceback" not in err
    with pytest.raises(BenchError, match=why):
        submit(run, "org/results", endpoint="http://127.0.0.1:9", token="t")
    e = _entry(run.parent.parent, suites=[made[0]])
    assert e.status == "rejected" and why in e.reason and e.model_id == "?"


def test_one_hostile_entry_never_takes_the_board_down(run, made, capsys):
    root = run.parent.parent
    huge_int = b'{"kind": "genshift-result", "schema_version": ' + b"9" * 5000 + b"}"
    for name, data in {"deep": b"[" * 100_000 + b"]" * 100_000, "nan": None, "huge": b"{" + b" " * (6 << 20) + b"}",
                       "list": b"[1, 2]", "bigint": huge_int}.items():
        d = root / "toy" / name
        d.mkdir()
        if data is None:
            r = json.loads((run / "result.json").read_text())
            r["metrics"]["configs"]["base"]["acc1"]["value"] = float("nan")
            data = json.dumps(r).encode()
            shutil.copytree(run / "predictions", d / "predictions")
        (d / "result.json").write_bytes(data)
    (root / "toy" / "fifo").mkdir()
    os.mkfifo(root / "toy" / "fifo" / "result.json")  # reading it would block the board forever
    store = load_store(str(root), suites=[made[0]])
    assert [e.path.parent.name for e in store.entries] == [run.name]
    assert "not a regular file" in {e.path.parent.name: e.reason for e in store.rejected}["fifo"]
    reasons = {e.path.parent.name: e.reason for e in store.rejected}
    assert "nests deeper than 32 levels" in reasons["deep"]
    assert "not valid JSON" in reasons["nan"] and "over the 5 MiB limit" in reasons["huge"]
    assert "a JSON object" in reasons["list"] and reasons["bigint"]
    assert main(["verify", str(root / "toy" / "deep")]) == 3
    assert "nests deeper than 32 levels" in capsys.readouterr().err


# -- fuzzing: never a traceback, never an accepted forgery ------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
# what the board's numbers and their identity are made of: a change to any of these must never verify
# (model metadata and preprocessing are compared by the re-run, which a signed stamp requires)
SHOWN = [("metrics",), ("counts",), ("flags",), ("predictions",), ("protocol",), ("suite", "manifest_sha256"),
         ("suite", "id"), ("suite", "configs"), ("suite", "metric_family"), ("suite", "pinned"), ("model", "id"),
         ("model", "source"), ("model", "weights_revision"), ("model", "weights_sha256")]


def _get(obj, path):
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return KeyError
        obj = obj[k]
    return obj


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@pytest.fixture(scope="module")
def fuzz_run(made, tmp_path_factory):
    dst = tmp_path_factory.mktemp("fuzz") / "store" / "toy" / made[1].name
    shutil.copytree(made[1], dst)
    return dst


def _mutate(original, data):
    """1-3 random edits (replace, delete, add) anywhere in the result; the forger may then fix the config hash."""
    r = json.loads(json.dumps(original))
    paths = sorted(_paths(r), key=str)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = r
        for k in path[:-1]:
            ok = (isinstance(parent, dict) and k in parent
                  or isinstance(parent, list) and isinstance(k, int) and k < len(parent))
            parent = parent[k] if ok else None
            if parent is None:
                break
        if not path or not isinstance(parent, (dict, list)):
            continue
        key = path[-1]
        if isinstance(parent, dict) and key not in parent or isinstance(parent, list) and (
                not isinstance(key, int) or key >= len(parent)):  # an earlier edit changed the parent's type
            continue
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(JSON_VALUES)
        else:
            parent[key] = data.draw(JSON_VALUES)
    if data.draw(st.booleans()):
        try:
            r["config_hash"] = config_hash(r["model"], r["suite"], r["protocol"], r["data_config"])
        except Exception:  # noqa: BLE001 - the forger's own tool broke on the mutation; keep the result as is
            pass
    return r


def test_a_boolean_in_place_of_a_metric_number_does_not_verify(fuzz_run, trusted):
    """JSON ``false`` equals 0 in Python: a metric bound replaced by ``false`` where the recomputed value is
    0.0 must still be a mismatch (found by the fuzz test below)."""
    original = json.loads((fuzz_run / "result.json").read_text())
    r = json.loads(json.dumps(original))
    config, name = next((c, k) for c, ms in r["metrics"]["configs"].items() for k, v in ms.items()
                        if isinstance(v, dict) and isinstance(v.get("ci"), list) and v["ci"][0] == 0)
    r["metrics"]["configs"][config][name]["ci"][0] = False  # == 0.0 in Python, not in the result
    (fuzz_run / "result.json").write_bytes(json.dumps(r).encode())
    try:
        try:
            rep = verify_result(fuzz_run, suites=trusted)
        except BenchError:
            return  # refused at the schema: also fine
        assert not rep.ok and any(f"{config}.{name}.ci[0]" in p for p in rep.problems), rep.problems
    finally:
        (fuzz_run / "result.json").write_bytes(canonical_json(original))


def test_a_null_scoring_switch_is_refused_even_with_a_fixed_config_hash(fuzz_run, trusted):
    """``protocol.scoring.fold_weather: null`` scores as false, so the recomputed metrics of a result
    made without folding match and only the schema can refuse it (found by the fuzz test below)."""
    original = json.loads((fuzz_run / "result.json").read_text())
    r = json.loads(json.dumps(original))
    r["protocol"]["scoring"]["fold_weather"] = None
    r["config_hash"] = config_hash(r["model"], r["suite"], r["protocol"], r["data_config"])
    (fuzz_run / "result.json").write_bytes(json.dumps(r).encode())
    try:
        with pytest.raises(BenchError, match="fold_weather"):
            verify_result(fuzz_run, suites=trusted)
    finally:
        (fuzz_run / "result.json").write_bytes(canonical_json(original))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_results_never_crash_and_never_pass_as_changed(fuzz_run, trusted, data):
    original = json.loads((fuzz_run / "result.json").read_text())
    r = _mutate(original, data)
    (fuzz_run / "result.json").write_bytes(json.dumps(r).encode())
    try:
        rep = verify_result(fuzz_run, suites=trusted)
    except BenchError:
        return
    finally:
        (fuzz_run / "result.json").write_bytes(canonical_json(original))
    if rep.ok:
        changed = [p for p in SHOWN if _get(r, p) != _get(original, p)]
        assert not changed, f"accepted a change to {changed}"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_results_in_the_store_never_take_it_down_or_show_a_change(fuzz_run, made, tmp_path_factory, data):
    original = json.loads((fuzz_run / "result.json").read_text())
    r = _mutate(original, data)
    (fuzz_run / "result.json").write_bytes(json.dumps(r).encode())
    cache = tmp_path_factory.mktemp("cache")
    try:
        store = load_store(str(fuzz_run.parent.parent), suites=[made[0]], cache_dir=str(cache))
    finally:
        (fuzz_run / "result.json").write_bytes(canonical_json(original))
    assert len(store.entries) + len(store.rejected) == 1
    for e in store.entries:  # shown as a community entry at most: its numbers are its own claim, never verified
        assert not e.verified and e.note.startswith("not verified")
    for e in store.rejected:
        assert e.reason and e.result is None


PRED_COLUMNS = ("image_id", "label", "keep", "topk_idx", "topk_prob", "true_prob", "true_rank")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_predictions_recomputed_by_the_forger_never_pass(made, trusted, tmp_path_factory, data):
    run = tmp_path_factory.mktemp("pfuzz") / "toy" / made[1].name
    shutil.copytree(made[1], run)
    config = data.draw(st.sampled_from(["base", "shifted"]))
    f = run / "predictions" / f"{config}.parquet"
    before = pq.read_table(f)
    rows = before.to_pylist()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(rows) - 1))
        c = data.draw(st.sampled_from(PRED_COLUMNS + ("drop", "dup")))
        if c == "drop":
            rows.pop(i)
        elif c == "dup":
            rows.append(dict(rows[i]))
        elif c in ("topk_idx", "topk_prob"):
            j = data.draw(st.integers(0, len(rows[i][c]) - 1))
            v = data.draw(st.integers(-5, 1005) if c == "topk_idx" else st.floats(-0.5, 1.5, width=32))
            rows[i][c] = rows[i][c][:j] + [v] + rows[i][c][j + 1:]
        else:
            rows[i][c] = data.draw({"image_id": st.text(min_size=1, max_size=12), "label": st.integers(-5, 1005),
                                    "keep": st.booleans(), "true_prob": st.floats(-0.5, 1.5, width=32),
                                    "true_rank": st.integers(-5, 1005)}[c])
        if not rows:
            return
    try:
        t = pa.Table.from_pylist(rows, schema=before.schema)
    except (pa.ArrowInvalid, OverflowError):
        return
    if t.equals(before):
        return
    try:
        forge(run, config, lambda _: t)
    except Exception:  # noqa: BLE001 - scoring rejected the forger's rows; nothing reached the store
        return
    rep = verify_result(run, suites=trusted)
    if rep.ok:  # what passes without a re-run changes no row identity and no number (the re-run compares the rest)
        after = pq.read_table(f)
        ident = ["image_id", "label", "keep"]
        assert after.select(ident).equals(before.select(ident))
        assert json.loads((run / "result.json").read_text())["metrics"] == json.loads(
            (made[1] / "result.json").read_text())["metrics"]
    shutil.rmtree(run.parent.parent)


def test_the_manifest_alone_checks_a_result_and_a_shipped_manifest_is_not_a_trust_root(tmp_path, tiny_checkpoint,
                                                                                        capsys):
    """A manifest carrying rows digests (format 1.1) is enough to check a result: no images, no rows."""
    from genshift import evaluate
    from genshift.suite_format import LocalSuite, rows_digest
    from genshift.synthetic import make_synthetic_suite

    suite = tmp_path / "suite"
    make_synthetic_suite(suite, suite_id="small", configs=("base",), classes=range(3), per_class=3)
    local = LocalSuite.open(suite)
    local.verify()
    t = local.read_columns("base", ["image_id", "label", "keep"])
    manifest = json.loads((suite / "manifest.json").read_text())
    manifest["configs"]["base"]["rows_digest"] = rows_digest(*(t[c].to_pylist() for c in ("image_id", "label", "keep")))
    (suite / "manifest.json").write_bytes(canonical_json(manifest))
    path = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(suite), out=tmp_path / "store",
                    workers=0, compile="off", progress=False).path
    trusted_dir = tmp_path / "trusted"
    trusted_dir.mkdir()
    shutil.copy(suite / "manifest.json", trusted_dir / "small.json")
    shutil.rmtree(suite)  # no rows, no images: only the trusted manifest is left
    only = TrustedSuites.from_paths([trusted_dir], registry=False)
    rep = verify_result(path, suites=only)
    assert rep.ok, rep.problems
    assert rep.rows_digests == {"base": manifest["configs"]["base"]["rows_digest"]} and rep.suite.local is None
    forge(path.parent, "base", lambda t: t.take(np.arange(1, t.num_rows)))  # one row dropped
    rep = verify_result(path, suites=only)
    assert not rep.ok and any("rows digest" in p for p in rep.problems)
    assert main(["verify", str(path), "--suites", str(trusted_dir)]) == 1
    assert "do not reproduce the suite's rows digest" in capsys.readouterr().out
    # the forger ships a manifest of their own, with the digest of the forged rows, and points the result at it
    p = read_predictions(path.parent / "predictions" / "base.parquet")
    forged_digest = rows_digest(*(p[c].to_pylist() for c in ("image_id", "label", "keep")))
    forged = {**manifest, "configs": {"base": {**manifest["configs"]["base"], "rows": p.num_rows,
                                               "rows_digest": forged_digest}}}
    (tmp_path / "store" / "forged-suite").mkdir()
    (tmp_path / "store" / "forged-suite" / "manifest.json").write_bytes(canonical_json(forged))
    rewrite(path.parent, lambda r: r["suite"].update(manifest_sha256=sha256_file(tmp_path / "store" / "forged-suite" /
                                                                                   "manifest.json"),
                                                     source=str(tmp_path / "store" / "forged-suite")))
    rep = verify_result(path, suites=only)
    assert not rep.ok and any("no trusted manifest" in p for p in rep.problems)
    e = _entry(tmp_path / "store", suites=[trusted_dir])
    assert e.status == "rejected" and "does not trust" in e.reason
    e = _entry(tmp_path / "store")  # no suites configured: shown, never verified
    assert e.status == "accepted" and not e.verified


def test_signing_refuses_a_partial_run_with_one_line(made, tiny_checkpoint, tmp_path, capsys):
    """A run with --limit-per-class is honest but partial: `verify --sign` refuses it before re-running any
    image, and the stamp maker behind `bench review` refuses it too, so it can never carry a badge."""
    from genshift import evaluate

    path = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(made[0]), out=tmp_path / "runs",
                    batch_size=16, workers=0, compile="off", limit_per_class=2, progress=False).path
    assert json.loads(path.read_text())["flags"]["partial"] is True
    key = tmp_path / "m.key"
    stamps.generate_key(key)
    capsys.readouterr()
    code = main(["verify", str(path.parent), "--recheck", "2", "--checkpoint", str(tiny_checkpoint), "--suite",
                 str(made[0]), "--sign", str(key)])
    err = capsys.readouterr().err
    assert code != 0 and not (path.parent / "verification.json").exists()
    assert len(err.strip().splitlines()) == 1 and "--limit-per-class 2" in err and "partial" in err
    report = verify_result(path.parent, recheck=2, checkpoint=str(tiny_checkpoint), suite=str(made[0]))
    assert report.ok and report.recheck["n"] == 2  # the checks pass: only the signing is refused
    with pytest.raises(BenchError, match="not signed: .*partial"):
        stamps.make_stamp(report)


@pytest.mark.parametrize("where,value,why", [
    ("id", "timm/resnet50\u202e1k_ni", "format characters"),
    ("id", "timm/a\u2066b", "format characters"),
    ("num_params", 10**15, "less than or equal to"),
])
def test_schema_rejects_display_tricks_and_absurd_sizes(run, where, value, why):
    from genshift.eval.results import MAX_NUM_PARAMS, parse_result

    r = json.loads((run / "result.json").read_text())
    parse_result(canonical_json(r), where="ok")  # the honest result passes
    honest = r["model"]["id"]
    r["model"][where] = value
    with pytest.raises(IntegrityError, match=f"field 'model.{where}': .*{why}"):
        parse_result(canonical_json(r), where="x")
    r["model"]["num_params"] = MAX_NUM_PARAMS  # the bound itself is allowed
    r["model"]["id"] = honest
    parse_result(canonical_json(r), where="ok")


# -- issue 30: one identity, a re-check with a stated guarantee, bounded inputs ----------------------------------
LOOK_ALIKES = ["x", "timm/x", "hf-hub:timm/x", "x@v2", " x", "TIMM/x", "t\u0456mm/x", "someorg/x"]


@pytest.mark.parametrize("alias", LOOK_ALIKES)
def test_look_alike_ids_are_never_verified_or_signed(run, made, tiny_checkpoint, tmp_path, capsys, alias):
    """One result copied under eight spellings of an id, each re-verified with --recheck --checkpoint --sign as
    the attack did: every one is refused in one line naming the canonical id, and no stamp is written."""
    key = tmp_path / "m.key"
    stamps.generate_key(key)
    honest = json.loads((run / "result.json").read_text())["model"]["id"]
    rewrite(run, lambda r: r["model"].update(id=alias.replace("x", "test_resnet.r160_in1k")))
    capsys.readouterr()
    code = main(["verify", str(run), "--recheck", "--checkpoint", str(tiny_checkpoint), "--suite", str(made[0]),
                 "--sign", str(key)])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "canonical" in err, err
    assert f"their canonical id is '{honest}'" in err or "is not a canonical id" in err
    assert not (run / "verification.json").exists()
    assert load_store(str(run.parent.parent), suites=[str(made[0])]).entries == []  # the store refuses it too


def _doc_guarantee_table() -> dict[float, float]:
    """The detection table of docs/leaderboard.md ("What verified guarantees"): altered % -> caught %."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "leaderboard.md").read_text()
    section = text[text.index("### What verified guarantees"):]
    rows = re.findall(r"^\|\s*([0-9.]+)%\s*\|\s*([0-9.]+)%", section, re.M)
    return {float(a) / 100: float(b) / 100 for a, b in rows}


def test_the_documented_guarantee_holds_in_a_simulation_of_the_projects_own_draw():
    """docs/leaderboard.md states the default sample size, the formula and the chance to catch each fraction of
    altered rows; a simulation drawing with genshift.eval.verify.draw (the code bench verify and bench review
    run) catches forged rows as often as stated."""
    from genshift.eval.verify import DETECT_FRACTION, DETECT_PROBABILITY, draw, miss_probability, sample_size

    table = _doc_guarantee_table()
    assert set(table) == {0.001, 0.005, 0.01, 0.02, 0.05}
    total = 100_000
    n = sample_size(total)
    assert n == 915 and sample_size(10**7) == 919 and sample_size(200) == 198
    assert 1 - miss_probability(total, int(DETECT_FRACTION * total), n) >= DETECT_PROBABILITY
    rng = np.random.default_rng(0)
    trials = 2000
    for fraction, stated in table.items():
        assert abs((1 - miss_probability(total, int(fraction * total), 919)) - stated) < 0.006  # as printed
        forged = set(rng.choice(total, int(fraction * total), replace=False).tolist())
        caught = sum(not forged.isdisjoint(draw(total, n, seed).tolist()) for seed in range(trials)) / trials
        sigma = (stated * (1 - stated) / trials) ** 0.5
        assert caught >= stated - 4 * sigma - 0.005, (fraction, caught, stated)
    assert table[DETECT_FRACTION] >= DETECT_PROBABILITY


def test_signing_and_verify_share_the_guaranteed_default(run, made, tiny_checkpoint, tmp_path):
    """`bench verify --sign` without --recheck re-checks the guaranteed sample (here: every one of 80 rows, as a
    suite this small needs), as `bench verify --recheck` without N and `bench review` do."""
    from genshift.eval.verify import sample_size
    from genshift.leaderboard.review import Reviewer

    key = tmp_path / "m.key"
    stamps.generate_key(key)
    assert main(["verify", str(run), "--checkpoint", str(tiny_checkpoint), "--suite", str(made[0]),
                 "--sign", str(key)]) == 0
    rc = json.loads((run / "verification.json").read_text())["record"]["recheck"]
    assert rc["n"] == sample_size(80) == 80 and rc["N"] == 80 and rc["guarantee"] == {"fraction": 1 / 80,
                                                                                       "probability": 0.99}
    assert Reviewer("org/r", key_path=str(key), endpoint="http://127.0.0.1:9").recheck == "auto"


def test_the_rerun_is_batched_and_streamed(run, made, tiny_checkpoint, monkeypatch):
    """`--recheck all` on every image: the images go through the model in batches of --batch-size, never all at
    once (919 images in one batch reached 9.7 GB)."""
    import genshift.eval.models

    real, seen = genshift.eval.models.load_classifier, []

    def recording(*a, **k):
        clf = real(*a, **k)
        forward = clf.model.forward
        clf.model.forward = lambda x: seen.append(len(x)) or forward(x)
        return clf
    monkeypatch.setattr(genshift.eval.models, "load_classifier", recording)
    rep = verify_result(run, recheck="all", batch_size=8, checkpoint=str(tiny_checkpoint), suite=str(made[0]))
    assert rep.ok and rep.recheck["n"] == 80 and sum(seen) == 80 and max(seen) == 8, seen


def confident(t):
    """Every row a confident top-1 hit (label first at probability 0.9, still self-consistent)."""
    t = label_first(t)
    probs = np.stack(t["topk_prob"].to_numpy(zero_copy_only=False))
    probs = np.concatenate([np.full((len(probs), 1), 0.9), probs[:, :-1] / 10], axis=1).astype(np.float32)
    t = t.set_column(t.schema.get_field_index("topk_prob"), t.schema.field("topk_prob"),
                     pa.FixedSizeListArray.from_arrays(pa.array(probs.ravel()), probs.shape[1]))
    return col(t, "true_prob", probs[:, 0])


def test_a_rerun_failure_says_how_many_rows_disagree_never_which(run, made, tiny_checkpoint):
    forge(run, "shifted", confident)
    rep = verify_result(run, recheck="all", checkpoint=str(tiny_checkpoint), suite=str(made[0]))
    assert not rep.ok and rep.recheck["disagreeing"] > 0
    text = "\n".join(rep.problems + rep.checked) + json.dumps(rep.recheck)
    assert f"{rep.recheck['disagreeing']} of the 80 re-run rows disagree" in text
    ids = pq.read_table(run / "predictions" / "shifted.parquet")["image_id"].to_pylist()
    assert not any(i in text for i in ids)  # no image is named


@pytest.mark.subprocess
def test_a_zstd_bomb_predictions_file_is_refused_before_it_is_decoded(tmp_path):
    """A 2 KiB zstd parquet that decodes to 576 MiB (the board and the reviewer reached 3.96 GB on one): refused
    with one line, the reader's memory staying far below what the file decodes to; a file declaring more rows
    than any predictions file holds is refused from its footer alone."""
    import subprocess
    import sys

    big = pa.table({"image_id": pa.array(["a" * (1 << 20)] * 64)})
    with pq.ParquetWriter(tmp_path / "bomb.parquet", big.schema, compression="zstd") as w:
        for _ in range(9):
            w.write_table(big)
    del big
    pq.write_table(pa.table({"image_id": pa.array(["a"] * 2_100_000)}), tmp_path / "rows.parquet", compression="zstd")
    assert (tmp_path / "bomb.parquet").stat().st_size < 8192
    code = ("import re, sys\nfrom genshift.eval.predictions import read_predictions\n"
            "for f in sys.argv[1:]:\n    try:\n        read_predictions(f)\n    except Exception as e:\n"
            "        print(type(e).__name__, e)\n"
            # the peak resident size of this process (not inherited, as ru_maxrss is)
            "print(int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bomb.parquet"), str(tmp_path / "rows.parquet")],
                         capture_output=True, text=True, timeout=300).stdout.splitlines()
    assert out[0].startswith("IntegrityError") and "decompresses to more than 512 MiB" in out[0], out
    assert out[1].startswith("IntegrityError") and "2,100,000 rows" in out[1], out
    assert int(out[2]) < 400, f"peak RSS {out[2]} MiB"
