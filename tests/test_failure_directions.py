"""Failure directions (Jain et al.): planted directions are found, noise stays at the null."""

import numpy as np
import pytest

from genshift.eval.diagnose import (
    C_GRID,
    DirectionOptions,
    Whitening,
    candidate_captions,
    class_direction,
    search_svm,
)


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


@pytest.mark.slow
def test_diagnose_end_to_end_with_a_tiny_clip(tmp_path, toy_suite, tiny_checkpoint, monkeypatch):
    from genshift import evaluate
    from genshift.builders.real_models import tiny_open_clip
    from genshift.cli import main
    from genshift.eval import diagnose as diag

    rpath = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                     workers=0, compile="off", progress=False).path
    model, _, tok = tiny_open_clip()
    import open_clip
    enc = diag.ClipEncoder(model, open_clip.tokenize, 32, (0.48, 0.46, 0.41), (0.27, 0.26, 0.28), "tiny-clip")
    monkeypatch.setattr(diag.ClipEncoder, "from_pretrained", classmethod(lambda cls, *a, **k: enc))
    code = main(["diagnose", str(rpath.parent), "--cache-dir", str(tmp_path / "cache"), "--null", "0",
                 "--criterion", "top3"])
    assert code == 0
    import json
    rep = json.loads((rpath.parent / "diagnose.json").read_text())
    assert rep["clip"] == "tiny-clip" and rep["criterion"] == "top3" and rep["n_images"] > 0
    assert {c["label"] for c in rep["classes"]} <= set(range(10))
    assert list((tmp_path / "cache").rglob("*.npz"))  # embeddings cached for the next run


def _tiny_encoder(precision="auto"):
    import open_clip

    from genshift.builders.real_models import tiny_open_clip
    from genshift.eval import diagnose as diag

    model, _, _ = tiny_open_clip()
    return diag.ClipEncoder(model, open_clip.tokenize, 32, (0.48, 0.46, 0.41), (0.27, 0.26, 0.28), "tiny-clip",
                                  precision=precision)


def _png(img):
    import io

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_classifier_square_view_is_what_the_classifier_saw_square_resized():
    """The authors' path: the classifier's preprocessed image, un-normalised, square-resized to CLIP's size."""
    from PIL import Image

    from genshift.eval.diagnose import ImageView

    enc = _tiny_encoder()
    crop_cfg = {"input_size": [3, 160, 160], "interpolation": "bicubic", "mean": [0.5, 0.5, 0.5],
                "std": [0.5, 0.5, 0.5], "crop_pct": 0.875, "crop_mode": "center"}
    square_cfg = {**crop_cfg, "crop_pct": 1.0, "crop_mode": "squash"}
    # a uniform grey 128/255 survives the classifier's own normalisation: by hand, CLIP's red channel is
    # (0.50196 - 0.48) / 0.27 = 0.08133 whatever the classifier's mean/std
    grey = enc._image_tensor(_png(Image.new("RGB", (300, 200), (128, 128, 128))), ImageView(data_config=crop_cfg))
    assert tuple(grey.shape) == (3, 32, 32) and abs(float(grey[0].mean()) - 0.08133) < 1e-3
    # red | grey | blue bands, 2:1: the timm crop cuts the bands off, LANCE's squash keeps them, and so does CLIP's view
    a = np.full((200, 400, 3), 128, np.uint8)
    a[:, :40] = (255, 0, 0)
    a[:, -40:] = (0, 0, 255)
    stripes = _png(Image.fromarray(a))
    red = lambda x: float(x[0, :, :2].mean() * 0.27 + 0.48)  # back to [0, 1]
    assert red(enc._image_tensor(stripes, ImageView(data_config=square_cfg))) > 0.9
    assert red(enc._image_tensor(stripes, ImageView(data_config=crop_cfg))) < 0.6
    assert ImageView(data_config=crop_cfg).key() != ImageView(data_config=square_cfg).key()
    with pytest.raises(Exception, match="needs the classifier's data config"):
        ImageView("classifier-square")


def test_clip_precision_runs_under_autocast():
    """auto: fp16 on a GPU as the authors, fp32 on the CPU; bf16 autocast exercises the half path on the CPU."""
    import torch

    from genshift.eval.diagnose import ImageView

    assert _tiny_encoder().resolved_precision() == "fp32"
    gpu = _tiny_encoder()
    gpu.device = "cuda"
    assert gpu.autocast_dtype() == torch.float16  # decided without touching a GPU
    from PIL import Image

    imgs = [_png(Image.effect_noise((64, 64), 60 + 20 * i).convert("RGB")) for i in range(3)]
    view = ImageView("center-crop")
    calls = []
    half = _tiny_encoder("bf16")
    half.model.visual.register_forward_hook(lambda m, i, o: calls.append(o.dtype))
    e16, e32 = half.encode_images(imgs, view), _tiny_encoder("fp32").encode_images(imgs, view)
    assert calls == [torch.bfloat16]  # the tower ran in bf16 under autocast
    assert e16.dtype == np.float32 and not np.array_equal(e16, e32)
    cos = (e16 * e32).sum(1) / np.linalg.norm(e16, axis=1) / np.linalg.norm(e32, axis=1)
    assert cos.min() > 0.98


def test_whitening_against_a_named_reference_set(tmp_path, toy_suite, tiny_checkpoint, monkeypatch):
    from genshift import evaluate
    from genshift.cli import main
    from genshift.eval import diagnose as diag

    rpath = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                     workers=0, compile="off", progress=False).path
    enc = _tiny_encoder()
    monkeypatch.setattr(diag.ClipEncoder, "from_pretrained", classmethod(lambda cls, *a, **k: enc))
    fitted = []
    real_fit = diag.Whitening.fit
    monkeypatch.setattr(diag.Whitening, "fit",
                        classmethod(lambda cls, ref, **k: (fitted.append(ref), real_fit(ref, **k))[1]))
    assert main(["diagnose", str(rpath.parent), "--configs", "shifted", "--whiten-reference", "base",
                 "--cache-dir", str(tmp_path / "cache"), "--null", "0", "--criterion", "top3"]) == 0
    import json
    rep = json.loads((rpath.parent / "diagnose.json").read_text())
    assert rep["whitening_reference"]["configs"] == ["base"] and rep["whitening_reference"]["n"] == 40
    assert rep["embedding"]["image_view"]["kind"] == "classifier-square" and rep["embedding"]["precision"] == "fp32"
    assert rep["embedding"]["image_view"]["data_config"] == json.loads(rpath.read_text())["data_config"]
    # the statistics came from the base images' embeddings (cached under the classifier's view), not the analysed ones
    base = next((tmp_path / "cache").rglob("base__tiny-clip__classifier-square-*__fp32.npz"))
    with np.load(base) as f:
        np.testing.assert_array_equal(fitted[0], f["emb"])
    assert main(["diagnose", str(rpath.parent), "--whiten-reference", "nope", "--cache-dir", str(tmp_path / "cache"),
                 "--null", "0"]) != 0
