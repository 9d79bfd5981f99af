"""The board record and the store that reads it: what verification signs, what the page reads at start (no
predictions file, no metric recomputed), staleness found when a view hashes a file, and the ranking rules of
issue 30 (one entry per canonical identity and protocol) through the real store and page."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from genshift.eval import stamps
from genshift.eval.results import write_result
from genshift.fsutil import canonical_json, sha256_bytes, sha256_file
from genshift.identity import folder_name
from genshift.leaderboard import store as store_mod
from genshift.leaderboard.store import load_store
from tests.boardkit import app, board, common, fresh_caches, grid, key_of, move, table  # noqa: F401
from tests.synthetic_store import sign_entry, write_model


def _dir(root, model_id):
    return root / "imagenet-star" / folder_name(model_id)


def _local(root, tensors: str, *, arch="resnet18", declared=None, signed=True, **kw):
    """An entry scored from local weights (canonical id ``<arch>@sha256:<16 hex>``), optionally claiming a name."""
    path = write_model(root, model_id=f"{arch}@sha256:{tensors[:16]}", source="checkpoint", tensors_sha256=tensors,
                       architecture=arch, tag="", num_params=11e6, rng=np.random.default_rng(42),
                       **{**common(root), "skill": 1.0, **kw})
    if declared:
        r = json.loads(path.read_text())
        r["model"]["declared_name"] = declared
        write_result(path, r)
    if signed:
        sign_entry(path, key_of(root))
    return path


def test_the_record_holds_what_the_page_needs_and_counts_only_as_signed(tmp_path):
    root = board(tmp_path / "s", models=2)
    path = _dir(root, "timm/tie_a.in1k") / "result.json"
    raw = (path.parent / "verification.json").read_bytes()
    doc, result = json.loads(raw), json.loads(path.read_text())
    rec = {**doc["record"], "signature": doc["signature"]}  # the record, and a signature over exactly its bytes
    assert rec["kind"] == stamps.STAMP_KIND and rec["model"]["id"] == "timm/tie_a.in1k"
    assert rec["model"]["source"] == "hf-hub" and rec["model"]["tensors_sha256"] == result["model"]["tensors_sha256"]
    assert rec["metrics"] == result["metrics"] and rec["protocol"] == result["protocol"]  # intervals included
    assert rec["files"] == {"result.json": sha256_file(path),
                            **{p["path"]: sha256_file(path.parent / p["path"]) for p in result["predictions"]}}
    # the per-image correctness rank intervals need: top-1 hits of the scored rows, bit-packed, in image order
    from genshift.eval.predictions import read_predictions

    t = read_predictions(path.parent / "predictions" / "shift_01.parquet")
    t = t.filter(t["keep"])
    digest, hits = stamps.hits([rec, rec], "shift_01")
    assert hits.shape == (t.num_rows, 2) and hits[:, 0].tolist() == (t["true_rank"].to_numpy() == 0).tolist()
    assert digest == sha256_bytes("\n".join(t["image_id"].to_pylist()).encode())
    assert len(rec["correct"]["shift_01"]["hits"]) < t.num_rows  # compact: 8 images a byte, in base64
    trusted = stamps.load_trusted_keys(f"{key_of(root)}.pub")
    ok = dict(result_sha256=sha256_file(path), trusted=trusted)
    assert stamps.check_stamp(raw, **ok) == (rec, "")
    assert "does not trust" in stamps.check_stamp(raw, result_sha256=sha256_file(path), trusted={})[1]
    assert "stale: result.json changed" in stamps.check_stamp(raw, **{**ok, "result_sha256": "0" * 64})[1]
    edited = raw.replace(b'"n": ', b'"n":  ', 1)  # one byte of the record's layout, the numbers the same
    assert json.loads(edited) == doc and "does not match its content" in stamps.check_stamp(edited, **ok)[1]
    unsigned = doc["record"]
    assert stamps.check_stamp(canonical_json(unsigned), **ok)[1] == "the stamp is not signed"
    assert "re-verify" in stamps.check_stamp(canonical_json(doc), **ok)[1]  # re-encoded: not the signed bytes
    old = dict(unsigned, kind="genshift-verification", version=2)
    assert "re-verify" in stamps.check_stamp(stamps.sign(old, stamps.load_private_key(key_of(root))), **ok)[1]


def test_the_first_view_reads_no_predictions_file_and_recomputes_no_metric(tmp_path, monkeypatch):
    from genshift.eval import scoring, verify

    root = board(tmp_path / "s", models=4)
    for d in root.glob("*/*/predictions"):
        shutil.rmtree(d)  # nothing to read: the records alone draw the board
    monkeypatch.setattr(scoring, "score", lambda *a, **k: pytest.fail("a metric was recomputed"))
    monkeypatch.setattr(verify, "verify_result", lambda *a, **k: pytest.fail("an entry was re-verified"))
    at = app(root, trusted_keys=f"{key_of(root)}.pub")
    assert not at.exception
    main = grid(at, "main")
    assert len(main) == 6 and main["verified"].eq("✓ verified").all()
    assert main["rank_lo"].notna().all() and main["mean_shift_acc1_lo"].notna().all()  # intervals from the records


def test_records_are_read_with_the_cycle_collector_paused_and_it_is_back_after(tmp_path):
    import gc

    root = board(tmp_path / "s", models=3)
    seen = []

    def read(paths, files, t):  # the store's reader, watched
        seen.append(gc.isenabled())
        return store_mod.read_entries(paths, files, t)

    assert len(load_store(str(root), read=read, chunk=2).entries) == 5 and seen == [False, False, False]
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        load_store(str(root), read=lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    assert gc.isenabled()  # back on after a failure too
    gc.disable()
    try:
        load_store(str(root))
        assert not gc.isenabled()  # paused by someone else: left as it was
    finally:
        gc.enable()


def test_a_file_changed_after_signing_marks_its_entry_stale_when_a_view_reads_it(tmp_path):
    root = board(tmp_path / "s", models=4)
    keys = f"{key_of(root)}.pub"
    main = grid(app(root, trusted_keys=keys), "main")
    victim, donor = main["model"].iloc[0], main["model"].iloc[-1]
    shutil.copyfile(_dir(root, donor) / "predictions" / "shift_02.parquet",
                    _dir(root, victim) / "predictions" / "shift_02.parquet")
    assert victim in set(grid(app(root, trusted_keys=keys), "main")["model"])  # not read yet: the signed record
    at = app(root, trusted_keys=keys, query={"tab": "Model drilldown", "model": victim})
    assert not at.exception
    assert victim not in set(grid(at, "main")["model"])  # at once, in the session that read it
    why = grid(at, "community").set_index("model").loc[victim, "not_ranked_because"]
    assert why.startswith("not verified") and "predictions/shift_02.parquet" in why and "stale" in why
    other = app(root, trusted_keys=keys, query={"tab": "Rejected"})  # and in every other session
    assert victim not in set(grid(other, "main")["model"])
    rejected = table(other, "reason")
    assert "stale" in set(rejected["status"])
    # result.json edited after signing: stale at once, from its hash (every run hashes result.json)
    r = json.loads((_dir(root, donor) / "result.json").read_text())
    r["notes"] = "edited after verification"
    (_dir(root, donor) / "result.json").write_text(json.dumps(r))
    assert donor not in set(grid(app(root, trusted_keys=keys), "main")["model"])


def test_the_same_weights_under_two_ids_rank_once_and_the_hub_entry_wins(tmp_path):
    root = board(tmp_path / "s", models=3)
    hub = json.loads((_dir(root, "timm/tie_a.in1k") / "result.json").read_text())["model"]
    local = _local(root, hub["tensors_sha256"])  # the same tensors, saved locally and scored under their own id
    local_id = json.loads(local.read_text())["model"]["id"]
    at = app(root, trusted_keys=f"{key_of(root)}.pub", query={"tab": "Rejected"})
    main = grid(at, "main").set_index("model")
    assert "timm/tie_a.in1k" in main.index and local_id not in main.index and len(main) == 5
    assert f"same weights also submitted as {local_id}" in main.loc["timm/tie_a.in1k", "flags"]
    rejected = table(at, "reason")
    row = rejected[rejected["entry"].str.contains(local.parent.name, regex=False)].iloc[0]
    assert row["status"] == "superseded" and "Hub weights win over a local copy" in row["reason"]


def test_local_weights_are_never_shown_under_or_linked_to_a_hub_model(tmp_path):
    root = board(tmp_path / "s", models=3)
    mine = _local(root, "ab" * 32, declared="timm/tie_b.in1k", skill=4.0)  # other weights, claiming a Hub name
    mine_id = json.loads(mine.read_text())["model"]["id"]
    at = app(root, trusted_keys=f"{key_of(root)}.pub", query={"columns": ["model details"]})
    main = grid(at, "main").set_index("model")
    assert mine_id == "resnet18@sha256:abababababababab" and mine_id in main.index
    assert main.loc[mine_id, "weights"] == "local weights" and main.loc["timm/tie_b.in1k", "weights"] == "Hub"
    assert main.loc["timm/tie_b.in1k", "verified"] == "✓ verified"  # its entry is its own, untouched
    assert pd.isna(main.loc[mine_id, "card"]) and main.loc["timm/tie_b.in1k", "card"] == \
        "https://huggingface.co/timm/tie_b.in1k"
    # a local result that records a Hub model's id is rejected, with the id it would have had
    r = json.loads(mine.read_text())
    r["model"]["id"] = "timm/tie_b.in1k"
    forged = move(mine, root / "imagenet-star" / "forged")
    forged.write_text(json.dumps(r))
    store = load_store(str(root), trusted_keys=f"{key_of(root)}.pub")
    (bad,) = [e for e in store.rejected if e.run_dir.name == "forged"]
    assert "not the canonical id" in bad.reason and mine_id in bad.reason
    assert [e.model_id for e in store.entries].count("timm/tie_b.in1k") == 1


@pytest.mark.parametrize("model_id", [" timm/x.in1k", "hf-hub:timm/x.in1k", "timm/x.in1k@v2", "tіmm/x.in1k",
                                      "timm/x.in1k-other"])
def test_an_id_that_is_not_canonical_is_rejected_with_the_reason(tmp_path, model_id):
    root = board(tmp_path / "s", models=2, signed=False)
    p = write_model(root, model_id="timm/x.in1k", architecture="resnet18", tag="in1k", num_params=1e6, skill=1.0,
                    rng=np.random.default_rng(1), **common(root))
    r = json.loads(p.read_text())
    r["model"]["id"] = model_id  # the weights it records are still timm/x.in1k's (pretrained_cfg.hf_hub_id)
    p.write_text(json.dumps(r))
    store = load_store(str(root))
    (bad,) = [e for e in store.rejected if e.run_dir == p.parent]
    assert "model id" in bad.reason and ("not a canonical id" in bad.reason or "canonical id is 'timm/x.in1k'"
                                         in bad.reason), bad.reason
    at = app(root, query={"tab": "Rejected"})
    assert model_id.strip() not in set(grid(at, "community")["model"])
    assert any(p.parent.name in e for e in table(at, "reason")["entry"])


def test_another_protocol_is_a_board_of_its_own_never_a_replacement(tmp_path, monkeypatch):
    """Both results side by side (the folder rule, which keeps one result per model folder, switched off: the
    store's own rule behind it): the same model under another protocol is another board."""
    monkeypatch.setattr(store_mod, "misfiled", lambda path, doc: "")
    root = board(tmp_path / "s", models=3)
    src = _dir(root, "timm/tie_a.in1k")
    other = move(src / "result.json", root / "imagenet-star" / "copy")  # then the original put back
    shutil.copytree(other.parent, src)
    r = json.loads(other.read_text())
    r["protocol"]["scoring"]["n_boot"] = 100  # a genuine result of the same model, another protocol
    other.write_text(json.dumps(r))
    sign_entry(other, key_of(root), verified_at="2027-01-01T00:00:00+00:00")  # signed later, still no replacement
    store = load_store(str(root), trusted_keys=f"{key_of(root)}.pub")
    main_board, second = store.boards("imagenet-star")
    assert not store.superseded
    assert {e.run_dir.name for e in store.for_suite("imagenet-star") if e.model_id == "timm/tie_a.in1k"} == {src.name}
    assert [e.run_dir.name for e in store.for_suite("imagenet-star", second)] == ["copy"]
    at = app(root, trusted_keys=f"{key_of(root)}.pub")
    assert at.selectbox(key="board").options == [main_board, second] and len(grid(at, "main")) == 5
    at.selectbox(key="board").select(second).run()
    assert list(grid(at, "main")["model"]) == ["timm/tie_a.in1k"]


def test_only_the_same_model_and_protocol_replaces_and_only_with_a_newer_stamp(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "misfiled", lambda path, doc: "")
    root = board(tmp_path / "s", models=3)
    foreign = tmp_path / "forger.key"
    stamps.generate_key(foreign)

    def copy(folder, *, finished_at, signer=None, verified_at=None, skill):
        p = write_model(tmp_path / "tmp", model_id="timm/tie_a.in1k", architecture="resnet18", tag="in1k",
                        num_params=11e6, skill=skill, rng=np.random.default_rng(len(folder)), finished_at=finished_at,
                        **common(root))
        p = move(p, root / "imagenet-star" / folder)
        if signer:
            sign_entry(p, signer, verified_at=verified_at)
        return p

    copy("a-unsigned-9999", finished_at="9999-12-31T23:59:59+00:00", skill=9.0)  # unsigned, claims to be newest
    copy("a-forged", finished_at="9999-12-31T23:59:59+00:00", signer=foreign, skill=9.0)  # an untrusted key
    copy("resigned", finished_at="2020-01-01T00:00:00+00:00", signer=key_of(root), skill=-2.0,
         verified_at="2027-01-01T00:00:00+00:00")  # an older result, signed later: it replaces
    store = load_store(str(root), trusted_keys=f"{key_of(root)}.pub")
    shown = [e for e in store.entries if e.model_id == "timm/tie_a.in1k"]
    assert [e.run_dir.name for e in shown] == ["resigned"]
    reasons = {e.run_dir.name: e.reason for e in store.superseded}
    assert set(reasons) == {"a-unsigned-9999", "a-forged", "timm--tie_a.in1k"}
    assert "stamp signed later" in reasons["timm--tie_a.in1k"] and "verified" in reasons["a-unsigned-9999"]
    main = grid(app(root, trusted_keys=f"{key_of(root)}.pub"), "main").set_index("model")
    expected = json.loads((root / "imagenet-star" / "resigned" / "result.json").read_text())
    assert main.loc["timm/tie_a.in1k", "acc1/shift_01"] == pytest.approx(
        100 * expected["metrics"]["configs"]["shift_01"]["acc1"]["value"])
    # the same order whatever order the entries were read in
    again = store_mod.assemble(store_mod.Store("x", root, None), list(reversed(store.entries + store.superseded)))
    assert {e.model_id: e.run_dir.name for e in again.entries} == {e.model_id: e.run_dir.name for e in store.entries}
