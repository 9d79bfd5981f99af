"""Failure directions (Jain et al.): planted directions are found, noise stays at the null."""

import numpy as np
import pytest

from eval.failure_directions import (C_GRID, DirectionOptions, Whitening, candidate_captions, class_direction,
                                     search_svm)


def _planted(n=160, d=24, seed=0, strength=3.0):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, d))
    hard = rng.random(n) < 0.3           # a hidden subpopulation along dimension 0
    emb[hard, 0] += strength
    correct = ~hard | (rng.random(n) < 0.1)  # the model fails on most of it
    return emb, correct, hard


def test_whitening_matches_the_code():
    rng = np.random.default_rng(0)
    ref = rng.normal(2.0, 3.0, size=(50, 4))
    w = Whitening.fit(ref)
    z = w(ref[:3])
    manual = (ref[:3] - ref.mean(0)) / ref.std(0, ddof=1)
    manual /= np.linalg.norm(manual, axis=1, keepdims=True)
    assert np.allclose(z, manual)
    assert np.allclose(np.linalg.norm(z, axis=1), 1)


def test_planted_direction_is_recovered_with_strength_above_null():
    emb, correct, hard = _planted()
    ids = [f"img{i:03d}" for i in range(len(emb))]
    d = class_direction(5, ids, emb, correct, Whitening.fit(emb), DirectionOptions(n_null=5, k_images=10))
    assert d.status == "ok" and d.strength > 0.8
    assert d.strength > d.null_p95 and d.null_mean < 0.65
    hardest = [int(i[3:]) for i in d.hardest]
    assert np.mean(hard[hardest]) >= 0.8  # the most negative decision values are the planted subpopulation
    easiest = [int(i[3:]) for i in d.easiest]
    assert np.mean(hard[easiest]) <= 0.2


def test_pure_noise_stays_near_chance():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(120, 16))
    correct = rng.random(120) < 0.6
    d = class_direction(3, [str(i) for i in range(120)], emb, correct, Whitening.fit(emb), DirectionOptions(n_null=8))
    assert d.strength < 0.68  # a max over 7 noisy CV estimates: biased above 0.5, but not a real direction


def test_c_search_keeps_the_smallest_c_on_ties_and_guards_degenerate_classes():
    rng = np.random.default_rng(2)
    z = Whitening.fit(rng.normal(size=(40, 8)))(rng.normal(size=(40, 8)))
    y = rng.random(40) < 0.5
    strength, c, svm = search_svm(z, y.astype(int), DirectionOptions())
    assert c in C_GRID and svm is not None
    emb, _, _ = _planted(n=30)
    one_error = np.ones(30, bool)
    one_error[0] = False
    d = class_direction(1, [str(i) for i in range(30)], emb, one_error, Whitening.fit(emb), DirectionOptions(n_null=0))
    assert d.status == "skipped" and d.n_errors == 1 and d.strength is None


def test_captions_follow_the_code_and_name_the_planted_attribute():
    ref, caps = candidate_captions(207)  # Golden Retriever -> canine
    assert ref == "a photo of a Golden Retriever"
    assert "a photo of a green canine in the grass" in caps and "a photo of a canine" in caps
    assert len(caps) == 13 * (8 + 5)
    assert candidate_captions(207, reference="paper")[0] == "a photo of a canine"

    emb, correct, hard = _planted(d=24)
    rng = np.random.default_rng(5)
    base = rng.normal(size=24)

    def encode_text(texts):  # captions mentioning "green" point along the planted direction
        out = []
        for t in texts:
            v = base + 0.01 * rng.normal(size=24)
            if "green" in t:
                v = v.copy()
                v[0] += 3.0
            out.append(v)
        return np.stack(out)

    d = class_direction(207, [str(i) for i in range(len(emb))], emb, correct, Whitening.fit(emb),
                        DirectionOptions(n_null=0), encode_text=encode_text)
    assert "green" in d.hard_captions[0][0]
    assert all("green" not in c for c, _ in d.easy_captions[:3])
    assert d.proxy["hard_caption_accuracy"] <= d.proxy["easy_caption_accuracy"]


def test_diagnose_end_to_end_with_a_tiny_clip(tmp_path, toy_suite, tiny_checkpoint, monkeypatch):
    from benchmark.cli import main
    from builders.tiny import tiny_open_clip
    from eval import embeddings
    from eval.runner import EvalRequest, evaluate
    from eval.inference import InferenceOptions

    _, rpath = evaluate(EvalRequest(model="test_resnet.r160_in1k", suite=str(toy_suite), checkpoint=str(tiny_checkpoint),
                                    out=str(tmp_path / "runs"), inference=InferenceOptions(workers=0, compile="off")),
                        progress=False)
    model, _, tok = tiny_open_clip()
    import open_clip
    enc = embeddings.ClipEncoder(model, open_clip.tokenize, 32, (0.48, 0.46, 0.41), (0.27, 0.26, 0.28), "tiny-clip")
    monkeypatch.setattr(embeddings.ClipEncoder, "from_pretrained", classmethod(lambda cls, *a, **k: enc))
    code = main(["diagnose", str(rpath.parent), "--cache-dir", str(tmp_path / "cache"), "--null", "0",
                 "--criterion", "top3"])
    assert code == 0
    import json
    rep = json.loads((rpath.parent / "diagnose.json").read_text())
    assert rep["clip"] == "tiny-clip" and rep["criterion"] == "top3" and rep["n_images"] > 0
    assert {c["label"] for c in rep["classes"]} <= set(range(10))
    assert list((tmp_path / "cache").rglob("*.npz"))  # embeddings cached for the next run
