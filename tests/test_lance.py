"""LANCE: null-text inversion, prompt-to-prompt via attention processors, perturber, filters, checks, smoke suite."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from genshift.builders.lance_editor import Editor, EditorConfig, align_tokens
from genshift.builders.lance_perturb import (
    PAPER_TYPES,
    Edit,
    edits_from_answer,
    paper_type,
    parse_variations,
    sample_edits,
    word_diff,
)
from genshift.builders.seeding import derive_seed
from genshift.cli import main
from genshift.errors import BenchError
from genshift.suite_format import LocalSuite


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine extra threads only contend."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def editor(one_thread):
    return Editor.tiny(EditorConfig(steps=8, size=64, fs=(0.4, 0.8), nti_inner_steps=10))


@pytest.fixture(scope="module")
def photo():
    from skimage import data
    return Image.fromarray(data.chelsea()).resize((64, 64), Image.BICUBIC)


@pytest.fixture(scope="module")
def inversion(editor, photo):
    return editor.null_text_inversion(photo, "a photo of a cat sitting on a table")


def test_null_text_inversion_reconstructs_better_than_ddim_inversion(editor, inversion):
    z0 = inversion.trajectory[0]
    rec = editor.reconstruct(inversion)
    plain = editor.sample(inversion.z_T, [inversion.prompt], editor.embed([""]))  # DDIM inversion + guided sampling
    err_nti = float(((rec - z0) ** 2).mean())
    err_ddim = float(((plain - z0) ** 2).mean())
    assert err_ddim / err_nti > 1.2, (err_ddim, err_nti)
    assert len(inversion.uncond) == 8 and len(inversion.trajectory) == 9


def test_p2p_with_the_source_prompt_reproduces_the_reconstruction(editor, inversion):
    rec = editor.reconstruct(inversion)
    before = editor.unet_calls
    z, ctl = editor.edit(inversion, inversion.prompt, "")
    assert editor.unet_calls - before == 8  # one batched pass for the whole f sweep
    assert z.shape[0] == 3
    for b in range(3):
        assert torch.allclose(z[b:b + 1], rec, atol=2e-3), b
    assert ctl.num_layers == 8 and ctl.cross_layers == 4  # attached through diffusers attention processors
    assert ctl.calls == 8 * 8 and ctl.cur_step == 8
    procs = editor.unet.attn_processors  # restored afterwards
    assert not any(type(p).__name__ == "P2PAttnProcessor" for p in procs.values())


def test_low_precision_editor_runs_end_to_end(photo):
    """A bf16 UNet/VAE/text encoder (the --dtype float16/bfloat16 GPU setting; bf16 runs on CPU)."""
    ed = Editor.tiny(EditorConfig(steps=2, size=64, fs=(0.4,), nti_inner_steps=1))
    for m in (ed.unet, ed.vae, ed.text_encoder):
        m.to(torch.bfloat16)
    inv = ed.null_text_inversion(photo, "a photo of a cat")
    z, ctl = ed.edit(inv, "a photo of a dog", "dog")
    assert z.shape[0] == 2 and torch.isfinite(z.float()).all() and ctl.cross_layers > 0
    assert [im.size for im in ed.decode(z)] == [(64, 64), (64, 64)]


def test_p2p_edit_changes_the_image_and_reweights_the_edit_words(editor, inversion):
    rec = editor.reconstruct(inversion)
    target = "a photo of a dog sitting on a table"
    z, ctl = editor.edit(inversion, target, "dog")
    assert float((z[1:] - rec).abs().mean()) > 1e-3
    pos = editor.edit_word_positions(target, "dog")
    assert pos == [5] and ctl.equalizer[:, 5].tolist() == [2.0, 2.0] and ctl.equalizer[:, 4].tolist() == [1.0, 1.0]
    bug = Editor(editor.pipe, EditorConfig(steps=8, size=64, fs=(0.4, 0.8), eq_bug_compat=True))
    _, ctl2 = bug.edit(inversion, target, "dog")
    assert ctl2.equalizer[:, 5].tolist() == [2.0, 1.0]  # the released code's bug, reproduced on request
    z_again, _ = editor.edit(inversion, target, "dog")
    assert torch.equal(z, z_again)  # deterministic


def test_token_alignment_maps_kept_tokens():
    src = [49406, 320, 1125, 539, 320, 2368, 49407]
    tgt = [49406, 320, 1125, 539, 320, 1929, 2368, 49407]  # one word inserted
    m = align_tokens(src, tgt)
    assert m.tolist() == [0, 1, 2, 3, 4, -1, 5, 6]
    assert align_tokens([1, 2, 3], [1, 9, 3]).tolist() == [0, -1, 2]


def test_perturber_parsing_and_word_diff_on_hand_written_answers():
    cap = "a photo of a monkey in a green tree"
    ans = ("Below is ...\n### Variations:\n1. A photo of a monkey in a red tree\n"
           "2) a photo of a monkey in a green tree in the snow\n- \"a painting of a monkey in a green tree\"\n4. ok\n")
    assert parse_variations(ans) == ["A photo of a monkey in a red tree",
                                     "a photo of a monkey in a green tree in the snow",
                                     "a painting of a monkey in a green tree"]
    edits = edits_from_answer(cap, "adjective", ans)
    assert [(e.original, e.edit) for e in edits] == [("green", "red"), ("", "in the snow"), ("photo", "painting")]
    assert word_diff(cap, "a photo of a gorilla in a tall green tree") == ("monkey", "gorilla")
    # a phrase replaced around one shared word stays one edit; two changes are never cross-paired
    assert word_diff("a dog in the snow", "a dog on the beach") == ("in the snow", "on the beach")
    assert word_diff("a dog in the snow", "a dog on the beach", merge_gap=0) == ("in", "on")
    assert word_diff("a red dog sits on a big green lawn", "a red cat sits on a big blue wet lawn") == ("green",
                                                                                                       "blue wet")
    assert edits_from_answer(cap, "subject", "I cannot help with that.") == []  # parses to nothing
    assert edits_from_answer(cap, "subject", f"### Variations:\n1. {cap}\n") == []  # no change, no edit


def test_text_filter_with_the_real_sentence_bert():
    from genshift.builders.lance_perturb import TextFilter
    f = TextFilter.sentence_bert()
    cap = "a photo of a dog pulling a sled on the grass"
    keep = lambda new: f.check(Edit("x", cap, new, *word_diff(cap, new)), "dog sled")[0]  # noqa: E731
    assert not keep("a photo of a cat pulling a sled on the grass")   # "dog" -> "cat" touches the class
    assert keep("a photo of a dog pulling a sled on the snow")        # "grass" -> "snow" is a real edit
    ok, scores = f.check(Edit("x", cap, "a photo of a robot", "robot arm", "robot"), "dog sled")
    assert not ok and scores["reason"] == "original words not in the caption"


def test_sources_from_a_gated_hub_dataset_at_a_resolved_commit(tmp_path, caplog):
    """`--hub-val ORG/NAME`: validation parquet files (image bytes + label index) on a local Hub."""
    import io

    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature
    from huggingface_hub import HfApi

    from genshift import imagenet
    from genshift.builders.lance import find_hub_sources, load_crop
    from tests.fakehub import FakeHub

    wnids = ("n03218198", "n04356056")  # dog sled (537), sunglasses (837)
    labels = [537, 3, 837, 537, 837, 537, 1]  # other classes interleaved; a third dog sled beyond per_class
    def jpeg(i):
        buf = io.BytesIO()
        Image.new("L" if i == 0 else "RGB", (48, 32), (i * 30) if i == 0 else (i * 30, 0, 0)).save(buf, format="JPEG")
        return {"bytes": buf.getvalue(), "path": f"ILSVRC2012_val_{i + 1:08d}.JPEG"}
    ds = Dataset.from_dict({"image": [jpeg(i) for i in range(len(labels))], "label": labels},
                           features=Features({"image": ImageFeature(), "label": Value("int64")}))
    ds.to_parquet(str(tmp_path / "validation-00000-of-00001.parquet"), batch_size=3)  # 3 row groups
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("ILSVRC/imagenet-1k", repo_type="dataset")
        sha = api.upload_file(path_or_fileobj=str(tmp_path / "validation-00000-of-00001.parquet"),
                              path_in_repo="data/validation-00000-of-00001.parquet", repo_id="ILSVRC/imagenet-1k",
                              repo_type="dataset").oid
        kw = dict(wnids=wnids, per_class=2, cache_dir=str(tmp_path / "cache"), endpoint=fh.endpoint)
        srcs, prov = find_hub_sources("ILSVRC/imagenet-1k", **kw)
        assert prov == {"repo_id": "ILSVRC/imagenet-1k", "revision": sha, "files": "data/validation-*.parquet"}
        assert [(s.source_id, s.label) for s in srcs] == [("ILSVRC2012_val_00000001", 537),
                                                        ("ILSVRC2012_val_00000004", 537),
                                                        ("ILSVRC2012_val_00000003", 837),
                                                        ("ILSVRC2012_val_00000005", 837)]
        assert srcs[0].path is None and srcs[0].wnid == imagenet.wnids()[537]
        assert load_crop(srcs[0], 64).size == (64, 64) and load_crop(srcs[0], 64).mode == "RGB"
        with pytest.raises(BenchError, match="ILSVRC/imagenet-1k@.* is missing Hard ImageNet images: n03218198 "
                                             "\\(dog sled\\): 3/4; n04356056 \\(sunglasses\\): 2/4"):
            find_hub_sources(f"ILSVRC/imagenet-1k@{sha}", **{**kw, "per_class": 4})
        with pytest.raises(BenchError, match="no files matching 'val/\\*.parquet'; pass the validation parquet"):
            find_hub_sources("ILSVRC/imagenet-1k", files="val/*.parquet", **kw)


def test_sources_report_missing_classes_and_read_flat_layouts(tmp_path):
    from genshift.builders.lance import find_sources, load_crop
    from genshift.suites import HARD_IMAGENET_WNIDS
    root = tmp_path / "val"
    for w in HARD_IMAGENET_WNIDS[:14]:
        (root / w).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (40, 30), 128).save(root / w / f"ILSVRC2012_val_{i:08d}_{w}.JPEG")
    with pytest.raises(BenchError, match="missing Hard ImageNet images: n03218198 \\(dog sled\\): 2/50"):
        find_sources(root)
    srcs = find_sources(root, allow_partial=True, per_class=2)
    assert len(srcs) == 28 and srcs[0].wnid == "n03218198" and srcs[0].label == 537
    crop = load_crop(srcs[0], 64)
    assert crop.mode == "RGB" and crop.size == (64, 64)  # grayscale converted
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (50, 50)).save(flat / "ILSVRC2012_val_00000001.JPEG")
    Image.new("RGB", (50, 50)).save(flat / "ILSVRC2012_val_00000002.JPEG")
    (flat / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n04356056 1 2 3 4\n"
                                               "ILSVRC2012_val_00000002,n04355933 1 2 3 4\n")
    got = find_sources(flat, allow_partial=True)
    assert [(s.source_id, s.label) for s in got] == [("ILSVRC2012_val_00000001", 837)]  # 836 is not Hard ImageNet


def test_checks_choose_the_best_passing_f():
    from genshift.builders.lance import CheckScores, choose
    s = [CheckScores(0.4, 0.9, 0.3, 0.3, 0.25, 0.3, 0.2, True), CheckScores(0.6, 0.9, 0.3, 0.3, 0.4, 0.3, 0.2, True),
         CheckScores(0.8, 0.5, 0.3, 0.3, 0.9, 0.3, 0.2, False)]
    assert choose(s).f == 0.6 and choose(s[2:]) is None


def test_clusters_rank_by_mean_delta_p():
    from genshift.eval.diagnose import cluster_edits
    rng = np.random.default_rng(0)
    a = rng.normal([5, 0, 0], 0.1, (10, 3))
    b = rng.normal([0, 5, 0], 0.1, (12, 3))
    dp = np.r_[np.full(10, 0.1), np.full(12, 0.6)]
    out = cluster_edits(np.r_[a, b], dp, k=2)
    assert [c["size"] for c in out] == [12, 10] and out[0]["mean_delta_p"] == pytest.approx(0.6)


def _candidates():
    """17 planted candidates in the perturber's fixed type order (the order the old cut kept)."""
    counts = {"subject": 5, "object": 5, "adjective": 3, "domain": 2, "background": 1, "weather": 1}
    return [Edit(t, "a photo of a dog", f"a photo of a dog {t} {i}", "", f"{t} {i}") for t, n in counts.items()
            for i in range(n)]


def _sample(source_id, *, accept=lambda e: (True, {}), **kw):
    kw.setdefault("max_edits", 10)
    return sample_edits(_candidates(), seed=derive_seed(0, source_id, "edit-sampling"), accept=accept, **kw)


def test_edit_sampling_draws_types_as_algorithm_1_and_caps_after_sampling():
    draws = _sample("ILSVRC2012_val_00000001")
    kept = [d for d in draws if d.accepted]
    assert len(kept) == len(draws) == 10
    types = [d.edit_type for d in kept]
    assert len(set(types)) >= 4 and set(types) <= set(PAPER_TYPES)  # not the fixed-order 5 subject + 5 object
    assert [d.edit for d in draws] == [d.edit for d in _sample("ILSVRC2012_val_00000001")]  # same seed, same draws
    assert [d.edit for d in draws] != [d.edit for d in _sample("ILSVRC2012_val_00000002")]  # another image differs
    # weather is a background edit: the fine type stays on the edit
    assert all(d.edit_type == paper_type(d.edit.edit_type) for d in draws)
    assert paper_type("weather") == "background" and paper_type("weather", separate_weather=True) == "weather"
    # candidates are drawn without replacement: an uncapped run draws each of the 17 exactly once
    everything = _sample("ILSVRC2012_val_00000001", max_edits=100)
    assert sorted(d.edit.edited_caption for d in everything) == sorted(e.edited_caption for e in _candidates())
    # --cap-counts kept: rejected subjects are drawn but do not count
    reject_subject = lambda e: (e.edit_type != "subject", {})  # noqa: E731
    no_subject = _sample("ILSVRC2012_val_00000001", accept=reject_subject, cap="kept")
    assert sum(d.accepted for d in no_subject) == 10 and len(no_subject) > 10
    assert {d.edit_type for d in no_subject if not d.accepted} == {"subject"}
    # --cap-counts tries (the default, Algorithm 1's N): 10 draws, a rejected one uses its try;
    # the same seed draws the same sequence, so the tries are the first 10 draws of the kept run
    tries = _sample("ILSVRC2012_val_00000001", accept=reject_subject)
    assert len(tries) == 10 and [d.edit for d in tries] == [d.edit for d in no_subject[:10]]
    assert sum(d.accepted for d in tries) == 10 - sum(d.edit_type == "subject" for d in tries) < 10
    with pytest.raises(BenchError, match="unknown cap meaning 'all'"):
        _sample("x", cap="all")
    with pytest.raises(BenchError, match="unknown edit sampling"):
        _sample("x", method="round-robin")


def test_type_uniform_weights_types_equally_and_pool_uniform_weights_edits():
    """Hand-computed: with 16 subject edits and 1 background edit, the first draw is the background
    edit with probability 1/2 (a type uniformly, Algorithm 1) or 1/17 (an edit uniformly)."""
    pool = [Edit("subject", "c", f"c s{i}", "", f"s{i}") for i in range(16)] + [Edit("background", "c", "c b", "", "b")]
    n = 3000
    for method, p in (("type-uniform", 1 / 2), ("pool-uniform", 1 / 17)):
        first = [sample_edits(pool, seed=s, max_edits=1, accept=lambda e: (True, {}), method=method)[0].edit_type
                 for s in range(n)]
        freq = first.count("background") / n
        assert abs(freq - p) < 4 * (p * (1 - p) / n) ** 0.5, (method, freq)


@pytest.fixture(scope="module")
def smoke_suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("lance") / "suite"
    assert main(["build", "lance-hardimagenet", "--smoke", "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.slow
def test_smoke_suite_pairs_and_eval(smoke_suite, tmp_path, tiny_checkpoint, tiny_folder):
    suite = LocalSuite.open(smoke_suite)
    suite.verify()
    assert suite.configs == ["counterfactual", "original", "reconstruction"]
    cf = suite.read_columns("counterfactual", ["pair_id", "edit_type", "edit_type_fine", "f", "edit_text_direction",
                                               "edit_sampling_seed", "source_image_id"]).to_pylist()
    originals = set(suite.read_columns("original", ["pair_id"])["pair_id"].to_pylist())
    recons = set(suite.read_columns("reconstruction", ["pair_id"])["pair_id"].to_pylist())
    assert cf and originals == recons and {r["pair_id"] for r in cf} <= originals
    assert all(r["f"] in (0.4, 0.6, 0.8) and len(r["edit_text_direction"]) == 32 for r in cf)
    assert suite.manifest.generator["smoke_relaxed_thresholds"] is True
    # five paper types (weather within background), the fine type kept, the sampling seed per row
    assert {r["edit_type"] for r in cf} <= set(PAPER_TYPES) and "weather" in {r["edit_type_fine"] for r in cf}
    assert all(r["edit_type"] == paper_type(r["edit_type_fine"]) for r in cf)
    assert all(r["edit_sampling_seed"] == derive_seed(0, r["source_image_id"], "edit-sampling") for r in cf)
    counts = suite.manifest.generator["counterfactuals"]
    assert counts["edit_type"] == {t: sum(r["edit_type"] == t for r in cf) for t in counts["edit_type"]}
    assert sum(suite.manifest.generator["edits_tried"]["edit_type"].values()) >= len(cf)
    assert main(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite",
                 str(smoke_suite), "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress"]) == 0
    result = json.loads((tmp_path / "runs/lance-hardimagenet" / tiny_folder / "result.json").read_text())
    lance = result["metrics"]["lance"]
    assert lance["n_pairs"] == len(cf)  # a Δp for every pair
    from genshift.eval.metrics import (
        paper_edit_type,  # Δp is reported by the paper's five types (weather in background)
    )
    assert set(lance["delta_p_by_edit_type"]) == {paper_edit_type(r["edit_type"]) for r in cf}
    assert result["analysis"]["lance_edit_clusters"]["clusters"]


def _manifest_sha(out) -> str:
    from genshift.suite_format import Manifest
    return Manifest.load(out).sha256


@pytest.mark.slow
def test_each_stage_resumes_from_its_checkpoint_to_the_same_bytes(tmp_path, monkeypatch):
    """A build stopped in the edit stage and then in the image stage resumes where each image left off: a
    resumed stage never loads the models of the stages done (no captioner once every caption is on disk),
    runs only the images not done, and the suite has the bytes of an uninterrupted build (each image's plan
    goes through its JSON checkpoint)."""
    from genshift.builders import lance

    args = ["build", "lance-hardimagenet", "--smoke", "--no-progress", "--max-edits", "1"]
    assert main(args + ["--out", str(tmp_path / "whole")]) == 0
    calls: list = []

    def record(name, fn, crash_after=None):
        def inner(*a, **kw):
            if crash_after is not None and sum(c[0] == name for c in calls) == crash_after:
                raise RuntimeError("simulated crash")
            calls.append((name, a[0].source_id if hasattr(a[0], "source_id") else a[0]))
            return fn(*a, **kw)
        return inner

    real = {n: getattr(lance, n) for n in ("load_models", "caption_image", "plan_edits", "render_image")}

    def patch(**crash):
        calls.clear()
        for n, fn in real.items():
            monkeypatch.setattr(lance, n, record(n, fn, crash.get(n)))
    out = tmp_path / "suite"
    patch(plan_edits=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(args + ["--out", str(out)])
    assert [c[0] for c in calls].count("caption_image") == 4 and [c[0] for c in calls].count("plan_edits") == 2
    planned = {c[1] for c in calls if c[0] == "plan_edits"}
    patch(render_image=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(args + ["--out", str(out)])
    names = [c[0] for c in calls]
    assert ("load_models", "caption") not in calls and "caption_image" not in names  # every caption was on disk
    assert {c[1] for c in calls if c[0] == "plan_edits"} == {f"smoke_{i:04d}" for i in range(4)} - planned
    rendered = {c[1] for c in calls if c[0] == "render_image"}
    assert len(rendered) == 1 and {p.stem for p in (out / ".work").glob("*.parquet")} == rendered
    patch()
    assert main(args + ["--out", str(out)]) == 0
    assert calls[0] == ("load_models", "images") and [c[0] for c in calls[1:]] == ["render_image"] * 3
    assert rendered.isdisjoint(c[1] for c in calls)
    assert _manifest_sha(out) == _manifest_sha(tmp_path / "whole")


@pytest.mark.slow
def test_rows_of_an_older_builder_are_refused_before_any_shard_is_written(tmp_path, monkeypatch, capsys):
    """A checkpointed image without the models that made it (an older builder) cannot be told apart from one
    made with other models: the build stops with one line naming --overwrite, before writing any shard."""
    import pyarrow.parquet as pq

    from genshift.builders import lance

    out = tmp_path / "suite"
    args = ["build", "lance-hardimagenet", "--smoke", "--no-progress", "--max-edits", "1", "--out", str(out)]
    real, done = lance.render_image, []

    def crash_after_one(*a, **kw):
        if done:
            raise RuntimeError("simulated crash")
        done.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(lance, "render_image", crash_after_one)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(args)
    monkeypatch.setattr(lance, "render_image", real)
    rows = next((out / ".work").glob("*.parquet"))
    table = pq.read_table(rows)
    pq.write_table(table.replace_schema_metadata({b"tried": table.schema.metadata[b"tried"]}), rows)
    capsys.readouterr()
    assert main(args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0] and "older version" in err[0], err
    assert not [p for p in out.rglob("*.parquet") if ".work" not in p.parts]  # no shard written


def test_an_unreadable_plan_is_made_again_and_nan_scores_keep_their_value(tmp_path):
    from genshift.builders.lance import _load_plan

    p = tmp_path / "x.plan.json"
    assert _load_plan(p) is None
    for bad in (b"{\"caption\": \"a photo of", b"[1, 2]", b'{"caption": 3}'):
        p.write_bytes(bad)
        assert _load_plan(p) is None
    plan = {"caption": "a photo of a dog", "kept": [{"scores": {"class_sim": float("nan"), "same_sim": None}}]}
    p.write_bytes(json.dumps(plan).encode())  # as the builder checkpoints it
    plan = _load_plan(p)
    assert plan["caption"] == "a photo of a dog" and np.isnan(plan["kept"][0]["scores"]["class_sim"])


@pytest.mark.slow
def test_each_stage_holds_only_its_own_models(tmp_path, monkeypatch):
    """The captioner is gone before the perturber and text filter load, and they are gone before the editor and
    CLIP load: a build holds one stage's models at a time (the four together need 31 GiB, docs/performance.md)."""
    import weakref

    from genshift.builders import lance

    alive: dict[str, weakref.ref] = {}
    seen = []

    def watch(fn):
        def inner(stage, *a, **kw):
            seen.append((stage, sorted(k for k, r in alive.items() if r() is not None)))
            models = fn(stage, *a, **kw)
            for k, m in enumerate(models):
                alive[f"{stage}[{k}]"] = weakref.ref(m)
            return models
        return inner
    monkeypatch.setattr(lance, "load_models", watch(lance.load_models))
    assert main(["build", "lance-hardimagenet", "--smoke", "--no-progress", "--max-edits", "1", "--out",
                 str(tmp_path / "suite")]) == 0
    assert seen == [("caption", []), ("edits", []), ("images", [])]
    assert all(r() is None for r in alive.values())


def test_bad_lance_input(tmp_path, capsys):
    assert main(["build", "lance-hardimagenet", "--out", str(tmp_path / "a")]) != 0
    assert "--imagenet-val" in capsys.readouterr().err
    assert main(["build", "lance-hardimagenet", "--out", str(tmp_path / "b"),
                 "--imagenet-val", str(tmp_path / "nope")]) != 0
    assert "does not exist" in capsys.readouterr().err
    assert main(["build", "lance-hardimagenet", "--smoke", "--out", str(tmp_path / "c"), "--edit-types", "wether"]) != 0
    err = capsys.readouterr().err
    assert "--edit-types: 'wether' is not one of" in err and "did you mean 'weather'" in err


@pytest.mark.slow
def test_smoke_suite_stores_jpeg_q75_records_the_cap_and_tells_the_papers_eval(smoke_suite):
    import io

    from PIL import Image

    suite = LocalSuite.open(smoke_suite)
    suite.verify()
    gen = suite.manifest.generator
    assert gen["image_format"] == "jpeg-q75" and gen["edit_sampling"]["cap"]["counts"] == "tries"
    # N = max_edits tries per image: never more edits sent to the editor than N per source image
    assert sum(gen["edits_tried"]["edit_type"].values()) <= gen["max_edits"] * gen["sources"]
    row = suite.read_columns("original", ["image"]).to_pylist()[0]["image"]
    img = Image.open(io.BytesIO(row["bytes"]))
    assert img.format == "JPEG"
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=75)  # PIL's default quality, as the authors saved
    assert img.quantization == Image.open(buf).quantization
    card = (smoke_suite / "README.md").read_text()
    assert "--preprocess lance-square" in card and "JPEG quality 75, like the files the paper scored" in card
    assert "tries per image (Algorithm 1" in card


def test_the_f_sweep_is_table_6s():
    """Table 6 (image editing): "self_replace_steps [19] | [0.4, 0.5, 0.6, 0.7, 0.8, 0.9]" (the released
    code stops at 0.8: ``--fs 0.4,0.5,0.6,0.7,0.8``)."""
    from genshift.builders.lance import Config, _editor_config

    assert Config().fs == (0.4, 0.5, 0.6, 0.7, 0.8, 0.9) == EditorConfig().fs
    assert _editor_config(Config()).fs == (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    assert _editor_config(Config(fs=(0.4, 0.5, 0.6, 0.7, 0.8))).fs[-1] == 0.8
    with pytest.raises(BenchError, match="fs: needs fractions in"):
        Config(fs=(0.4, 1.5))


def test_the_minimum_caption_length_counts_words_as_the_paper():
    """Sec. 3.1: "We use beam search decoding with a minimum caption length of 20 words"; Table 6's "min.
    caption length 20" with no unit is kept as ``--caption-length-unit tokens`` (new tokens)."""
    from genshift.builders.captioner import MinWords
    from genshift.builders.lance import Config, caption_length

    assert caption_length(Config()) == {"min_new_tokens": 0, "min_words": 20, "max_new_tokens": 100}
    assert caption_length(Config(caption_length_unit="tokens")) == {"min_new_tokens": 20, "max_new_tokens": 100}

    class Tok:  # one token per word
        eos_token_id = 0
        words = {1: "a", 2: "dog", 3: "on", 4: "grass"}

        def batch_decode(self, rows, skip_special_tokens=True):
            return [" ".join(self.words[int(t)] for t in r if int(t)) for r in rows]

    ids = torch.tensor([[9, 9, 1, 2, 3], [9, 9, 1, 2, 4]])  # two beams after a 2-token prompt: 3 words each
    scores = torch.zeros(2, 5)
    out = MinWords(Tok(), start=2, n=4)(ids, scores.clone())
    assert torch.isinf(out[:, 0]).all() and (out[:, 1:] == 0).all()  # fewer than 4 words: no end yet
    assert not torch.isinf(MinWords(Tok(), start=2, n=3)(ids, scores.clone())).any()  # 3 words: may end
    from genshift.builders.captioner import Captioner
    cap, seen = Captioner.tiny(), {}
    real = cap.model.generate
    cap.model.generate = lambda **kw: (seen.update(kw), real(**kw))[1]
    cap.caption([Image.new("RGB", (32, 32))], prefix="a photo of", num_beams=2, min_new_tokens=0, max_new_tokens=4,
                min_words=5)
    (proc,) = seen["logits_processor"]  # generation counts the words after the prompt
    assert isinstance(proc, MinWords) and proc.n == 5 and proc.start == seen["input_ids"].shape[1]
