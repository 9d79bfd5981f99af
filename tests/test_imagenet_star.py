"""ImageNet* builder: tokens, textual inversion, seeded generation, CLIP filter, resume, smoke suite."""

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from genshift.builders.imagenet_star import (
    RELEASED_KEPT_FRACTION,
    calibrate,
    keep_flags,
    released_kept_counts,
    shift_caption,
)
from genshift.builders.sd_generate import GenerationSettings, SDGenerator
from genshift.builders.seeding import derive_seed, generator
from genshift.builders.textual_inversion import (
    inject_tokens,
    load_token_zip,
    save_token_file,
    save_token_zip,
    token_name,
)
from genshift.cli import main
from genshift.errors import BenchError, IntegrityError
from genshift.suite_format import LocalSuite, shard_name

TINY = GenerationSettings(model_id="tiny", steps=2, height=32, width=32, output_size=24, batch_size=4)
PROMPT = "a photo of a tench in the snow"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine extra threads only contend."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def smoke_suite(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("star") / "suite"
    assert main(["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_gen(one_thread):
    return SDGenerator.tiny(TINY)


# -- generation ---------------------------------------------------------------------------------
def test_same_seed_same_bytes_and_images_do_not_depend_on_their_batch(tiny_gen):
    seeds = [derive_seed(0, "in_the_snow", c, k) for c in (0, 1) for k in (0, 1)]
    assert len(set(seeds)) == 4
    a = tiny_gen.generate([PROMPT] * 4, seeds)
    assert SDGenerator.tiny(TINY).generate([PROMPT] * 4, seeds) == a  # byte-identical JPEGs on CPU
    assert len({hashlib.sha256(x).hexdigest() for x in a}) == 4  # different ids -> different images
    assert tiny_gen.generate([PROMPT], seeds[2:3]) == a[2:3]  # alone = in a batch of 4
    # ... and equal to the authors' way: one plain pipeline call per image with its own generator
    im = tiny_gen.pipe(PROMPT, num_inference_steps=2, guidance_scale=7.5, height=32, width=32,
                       generator=generator(seeds[1]), output_type="pil").images[0].resize((24, 24))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=TINY.jpeg_quality)
    assert buf.getvalue() == a[1]


def test_low_precision_unet_with_float32_text_encoder():
    """fp16/bf16 UNet + fp32 text encoder (the GPU setting; bf16 runs on CPU) must generate."""
    from dataclasses import replace

    gen = SDGenerator.tiny(replace(TINY, steps=1))
    gen.pipe.unet.to(torch.bfloat16)
    gen.pipe.vae.to(torch.bfloat16)
    assert gen.pipe.text_encoder.dtype == torch.float32
    out = gen.generate([PROMPT, PROMPT], [1, 2])
    assert len(out) == 2 and out[0] != out[1] and out[0][:2] == b"\xff\xd8"
    assert gen.encode_prompts([PROMPT]).dtype == torch.bfloat16


def test_generation_backs_off_on_out_of_memory(tiny_gen):
    expected = tiny_gen.generate(["a"] * 3, [1, 2, 3])
    gen = SDGenerator.tiny(TINY)
    real, sizes = gen.denoiser, []

    def oom_above_one(**kw):
        sizes.append(kw["latents"].shape[0])
        if kw["latents"].shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(**kw)

    gen.denoiser = oom_above_one
    got = gen.generate(["a"] * 3, [1, 2, 3])
    assert gen.backoff.batch_size == 1 and sizes == [3, 2, 1, 1, 1]
    # the bytes of a run at the batch size the back-off settled on (equal batch composition, equal bytes) ...
    alone = SDGenerator.tiny(TINY)
    assert got == [alone.generate(["a"], [s])[0] for s in (1, 2, 3)]
    # ... and the same pictures as the batch of 3 (CPU kernels may differ in the last bits by batch size)
    def pixels(b):
        return np.asarray(Image.open(io.BytesIO(b))).astype(int)
    assert max(np.abs(pixels(x) - pixels(y)).max() for x, y in zip(got, expected)) <= 3


@pytest.mark.slow
def test_build_records_the_batch_size_left_after_out_of_memory_back_off(tmp_path, monkeypatch):
    real = SDGenerator._batch

    def oom_above_two(self, items):
        if len(items) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, items)

    monkeypatch.setattr(SDGenerator, "_batch", oom_above_two)
    out = tmp_path / "suite"
    assert main(["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress", "--shifts", "base"]) == 0
    generation = LocalSuite.open(out).manifest.generator["generation"]
    assert generation["batch_size"] == 4 and generation["batch_size_effective"] == {"0": 2}


# -- tokens -------------------------------------------------------------------------------------
def test_token_round_trip_injection_and_case_preserving_names(tmp_path):
    from genshift.builders.real_models import tiny_sd_components

    tokens = {0: torch.randn(32), 207: torch.randn(1, 32).half()}  # (D,) fp32 and (1, D) fp16 are accepted
    save_token_zip(tokens, tmp_path / "tokens.zip")
    save_token_zip(tokens, tmp_path / "again.zip")
    assert (tmp_path / "tokens.zip").read_bytes() == (tmp_path / "again.zip").read_bytes()  # reproducible
    loaded = load_token_zip(tmp_path / "tokens.zip", dim=32, classes=[0, 207])
    assert loaded[207].shape == (32,) and loaded[207].dtype == torch.float32
    assert torch.equal(loaded[207], tokens[207][0].float()) and torch.equal(loaded[0], tokens[0])
    save_token_file(tokens[0], tmp_path / "folder" / "tokens" / "0.bin")  # the trainer's folder layout
    assert torch.equal(load_token_zip(tmp_path / "folder", dim=32, classes=[0])[0], tokens[0])

    comp = tiny_sd_components()
    tok, enc = comp["tokenizer"], comp["text_encoder"]
    ids = inject_tokens(tok, enc, loaded)
    assert ids == {0: 49408, 207: 49409} and token_name(207) == "<Golden Retriever-207>"
    w = enc.get_input_embeddings().weight
    assert torch.equal(w[49409], loaded[207]) and torch.equal(w[49408], loaded[0])  # the injected row = the file
    ids_text = tok("a photo of a <Golden Retriever-207> in the snow").input_ids
    assert ids_text[5] == 49409 and len(ids_text) == 10
    assert tok.convert_ids_to_tokens(49409) == "<Golden Retriever-207>"  # capitals and space kept
    assert 49409 not in tok("a photo of a <golden retriever-207>").input_ids  # matched case-sensitively
    with pytest.raises(BenchError, match="already in the tokenizer"):
        inject_tokens(tok, enc, {0: loaded[0]})


def test_all_1000_tokens_get_the_authors_ids():
    from genshift.builders.real_models import tiny_sd_components

    comp = tiny_sd_components()
    g = torch.Generator().manual_seed(0)
    tokens = {c: torch.randn(32, generator=g) for c in range(1000)}
    ids = inject_tokens(comp["tokenizer"], comp["text_encoder"], tokens)
    assert all(ids[c] == 49408 + c for c in range(1000)) and len(comp["tokenizer"]) == 50408
    assert comp["tokenizer"]("<missile-744>").input_ids[1] == 49408 + 744  # duplicate names stay distinct
    assert torch.equal(comp["text_encoder"].get_input_embeddings().weight[49408 + 744], tokens[744])


@pytest.mark.parametrize("tensor, match", [
    (torch.randn(2, 32), "shape \\(2, 32\\)"),
    (torch.randn(16), "shape \\(16,\\)"),
    (torch.randint(0, 5, (32,)), "not a float tensor"),
    (torch.full((32,), float("nan")), "NaN"),
    ({"not": "a tensor"}, "expected a tensor"),
])
def test_bad_token_files(tmp_path, tensor, match):
    buf = io.BytesIO()
    torch.save(tensor, buf)
    with zipfile.ZipFile(tmp_path / "t.zip", "w") as zf:
        zf.writestr("tokens/0.bin", buf.getvalue())
    with pytest.raises(IntegrityError, match=match):
        load_token_zip(tmp_path / "t.zip", dim=32, classes=[0])


def test_token_files_missing_classes_or_not_a_zip(tmp_path):
    save_token_zip({0: torch.randn(32)}, tmp_path / "ok.zip")
    with pytest.raises(IntegrityError, match="no token for 1 class"):
        load_token_zip(tmp_path / "ok.zip", dim=32, classes=[0, 1])
    with pytest.raises(IntegrityError, match="no token for 999 class"):
        load_token_zip(tmp_path / "ok.zip", dim=32)  # the released file must hold all 1000
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(IntegrityError, match="not a zip file"):
        load_token_zip(tmp_path / "bad.zip", classes=[0])
    with pytest.raises(BenchError, match="does not exist"):
        load_token_zip(tmp_path / "absent.zip")


# -- textual inversion --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def class_folder(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("train")
    rng = np.random.default_rng(0)
    for wnid, colour in (("n01443537", (200, 30, 30)), ("n01440764", (30, 160, 40))):
        (root / wnid).mkdir()
        for i in range(3):
            arr = np.clip(np.array(colour) + rng.normal(0, 10, (40, 48, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(arr).save(root / wnid / f"{i}.png")
    (root / "n01484850").mkdir()  # great white shark: a class folder without images
    return root


def test_textual_inversion_lowers_the_loss_and_holds_the_norm(class_folder):
    from genshift.builders.real_models import tiny_sd_components
    from genshift.builders.textual_inversion import (
        TIConfig,
        TIRun,
        eval_loss,
        folder_classes,
        initializer,
        train_class_token,
    )

    run = TIRun.from_components(tiny_sd_components(sample_size=16))
    vocab, rows = len(run.tokenizer), run.text_encoder.get_input_embeddings().weight.shape
    cls = folder_classes(class_folder, classes=[1])[0]
    assert cls.name == "goldfish" and len(cls.files) == 3
    cfg = TIConfig(steps=40, lr=0.1, resolution=32, flip_p=0.0, templates=("a photo of a {}",))
    init = initializer(run.tokenizer, run.text_encoder, cls.name)
    vec, losses = train_class_token(run, cls, cfg)
    assert len(losses) == 40
    assert torch.allclose(vec.norm(), init.norm(), rtol=1e-5)  # only the direction is learned
    assert torch.cosine_similarity(vec, init, dim=0) < 0.99  # ... and it did move
    trained = eval_loss(run, cls, vec, cfg, n=12)
    assert trained < eval_loss(run, cls, init, cfg, n=12)
    g = torch.Generator().manual_seed(0)
    randoms = [eval_loss(run, cls, torch.randn(32, generator=g) * init.norm() / 32 ** 0.5, cfg, n=12)
               for _ in range(2)]
    assert trained < min(randoms)
    # nothing of the model was changed: no token added, the embedding module restored
    assert len(run.tokenizer) == vocab and run.text_encoder.get_input_embeddings().weight.shape == rows
    assert isinstance(run.text_encoder.get_input_embeddings(), torch.nn.Embedding)


def test_held_norm_embedding_serves_the_initialisers_norm():
    from genshift.builders.textual_inversion import SplitEmbedding

    base = torch.nn.Embedding(5, 4)
    init = torch.tensor([3.0, 0.0, 4.0, 0.0])  # norm 5
    split = SplitEmbedding(base, 5, init)
    with torch.no_grad():
        split.vector.mul_(7.0).add_(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    out = split(torch.tensor([[0, 5, 2]]))
    assert torch.allclose(out[0, 1].norm(), torch.tensor(5.0))
    assert torch.allclose(out[0, 1], split.vector * 5.0 / split.vector.norm())
    assert torch.equal(out[0, 0], base.weight[0]) and torch.equal(out[0, 2], base.weight[2])


def test_template_ids_match_a_tokenizer_with_the_token_added():
    from transformers import AddedToken

    from genshift.builders.real_models import clip_tokenizer
    from genshift.builders.textual_inversion import TEMPLATES, template_ids

    plain, added = clip_tokenizer(pad_token="!"), clip_tokenizer(pad_token="!")
    added.add_tokens([AddedToken("<goldfish-1>", normalized=False)])
    tid = added.convert_tokens_to_ids("<goldfish-1>")
    for t in TEMPLATES:
        assert template_ids(plain, t, tid) == added(t.format("<goldfish-1>"), padding="max_length",
                                                     max_length=77).input_ids
    assert len(TEMPLATES) == 27


def test_textual_inversion_low_precision_and_resume(class_folder, tmp_path, monkeypatch):
    from genshift.builders import textual_inversion as ti
    from genshift.builders.real_models import tiny_sd_components

    comp = tiny_sd_components(sample_size=16)
    comp["unet"].to(torch.bfloat16)  # the GPU setting (fp16 UNet/VAE, fp32 text encoder), bf16 on CPU
    comp["vae"].to(torch.bfloat16)
    run = ti.TIRun.from_components(comp)
    cfg = ti.TIConfig(steps=1, resolution=32)
    tokens = ti.train_tokens(class_folder, tmp_path / "work", run, cfg, classes=[0, 1], progress=False)
    assert sorted(tokens) == [0, 1] and json.loads((tmp_path / "work/meta/1.json").read_text())["name"] == "goldfish"

    def must_not_train(*a, **k):
        raise AssertionError("a finished class was trained again")

    monkeypatch.setattr(ti, "train_class_token", must_not_train)
    again = ti.train_tokens(class_folder, tmp_path / "work", run, cfg, classes=[0, 1], progress=False)
    assert all(torch.equal(again[c], tokens[c]) for c in (0, 1))
    with pytest.raises(BenchError, match="trained with other settings"):
        ti.train_tokens(class_folder, tmp_path / "work", run, ti.TIConfig(steps=2, resolution=32), classes=[0])
    with pytest.raises(BenchError, match="has no training images"):
        ti.folder_classes(class_folder, classes=[2])



def test_tokens_only_trains_the_class_tokens_and_stops(class_folder, tmp_path, monkeypatch):
    """`bench build imagenet-star --train-tokens DIR --tokens-only`: a dataset interface's tokens without
    generating (the tokens.zip layout of the release), resumable per class like a full build's training."""
    tiny = SDGenerator.tiny
    monkeypatch.setattr(SDGenerator, "from_pretrained", classmethod(lambda cls, settings, **kw: tiny(settings)))
    out = tmp_path / "interface"
    args = ["build", "imagenet-star", "--train-tokens", str(class_folder), "--tokens-only", "--classes", "0,1",
            "--ti-steps", "1", "--height", "32", "--width", "32", "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    tokens = load_token_zip(out / "tokens.zip", dim=None, classes=[0, 1])
    assert sorted(tokens) == [0, 1] and not (out / "data").exists() and not (out / "manifest.json").exists()
    assert main(["build", "imagenet-star", "--tokens-only", "--out", str(out)]) != 0  # what would it write?


# -- CLIP filter ----------------------------------------------------------------------------------
def test_calibration_hits_the_released_kept_counts_exactly():
    n, kept = released_kept_counts()
    assert n == 50000 and sum(v for k, v in kept.items() if k != "base") == 665737  # spec s6
    rng = np.random.default_rng(0)
    scores = {s: rng.normal(0.3, 0.05, n).astype(np.float32) for s in ("base", "embroidery", "in_the_grass")}
    th = {s: t.class_threshold for s, t in calibrate(scores, RELEASED_KEPT_FRACTION).items()}
    for s, v in scores.items():
        assert (v >= th[s]).sum() == kept[s]  # a full build keeps exactly the released counts
    small = {"base": rng.normal(0.3, 0.05, 1000), "in_the_rain": rng.normal(0.25, 0.05, 777)}
    th = {s: t.class_threshold for s, t in calibrate(small, {"base": 0.9263, "in_the_rain": 0.4833}).items()}
    assert (small["base"] >= th["base"]).sum() == 926 and (small["in_the_rain"] >= th["in_the_rain"]).sum() == 375
    assert shift_caption("a photo of a <TOKEN> in the snow") == "a photo of a thing in the snow"
    assert shift_caption("a photo of a <TOKEN>") is None


def test_class_plus_shift_rule_gates_on_shift_presence_and_still_hits_the_target():
    rng = np.random.default_rng(1)
    cls = {"in_the_snow": rng.normal(0.3, 0.05, 1000), "base": rng.normal(0.3, 0.05, 1000)}
    shf = {"in_the_snow": rng.normal(0.2, 0.03, 1000), "base": np.full(1000, np.nan)}
    th = calibrate(cls, {"in_the_snow": 0.5, "base": 0.9}, rule="class+shift", shift_scores=shf, shift_quantile=0.2)
    keep = keep_flags(cls["in_the_snow"], shf["in_the_snow"], th["in_the_snow"])
    assert keep.sum() == 500
    lowest = np.argsort(shf["in_the_snow"])[:200]
    assert not keep[lowest].any()  # the gate removed the 20% with the least shift presence
    assert th["base"].shift_threshold is None and keep_flags(cls["base"], shf["base"], th["base"]).sum() == 900
    with pytest.raises(BenchError, match="lower --shift-gate-quantile"):
        calibrate(cls, {"in_the_snow": 0.9, "base": 0.9}, rule="class+shift", shift_scores=shf, shift_quantile=0.5)
    zero = calibrate({"x": np.array([0.1, 0.2])}, {"x": 0.0})["x"]
    assert not keep_flags(np.array([0.1, 0.2]), np.array([np.nan, np.nan]), zero).any()


# -- the builder ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_smoke_suite_is_valid_and_scored_by_bench_eval(smoke_suite, tmp_path, tiny_checkpoint, tiny_folder):
    suite = LocalSuite.open(smoke_suite)
    suite.verify()
    m = suite.manifest
    assert suite.configs == ["base", "in_the_snow"] and all(c.rows == 4 for c in m.configs.values())
    assert m.configs["base"].kept == 3 and m.configs["in_the_snow"].kept == 2  # floor(4 x released fraction)
    ds = suite.dataset("in_the_snow")
    row = ds[0]
    assert row["prompt"] == f"a photo of a {token_name(row['label'])} in the snow"
    assert row["class_token"] == token_name(row["label"]) and row["scheduler"] == "EulerDiscreteScheduler"
    assert len(row["clip_image_embedding"]) == 32 and row["seed"] == derive_seed(0, "in_the_snow", row["label"],
                                                                                   row["sample"])
    assert row["steps"] == 2 and abs(row["guidance"] - 7.5) < 1e-6 and row["image"].size == (32, 32)
    th = m.generator["clip_filter"]["thresholds"]["in_the_snow"]["class"]
    cols = suite.read_columns("in_the_snow", ["clip_class_score", "keep"])
    assert cols["keep"].to_pylist() == [s >= th for s in cols["clip_class_score"].to_pylist()]  # recomputable
    card = (smoke_suite / "README.md").read_text()
    for text in ("2 steps, guidance 7.5", "EulerDiscreteScheduler", "0.73212", "tiny-open-clip", "quality 75",
                 "arXiv:2302.07865", "ImageNet terms", "textual inversion on synthetic images"):
        assert text in card
    assert not (smoke_suite / ".stage").exists()
    code = main(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite",
                 str(smoke_suite), "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress"])
    assert code == 0
    result = json.loads((tmp_path / "runs/imagenet-star" / tiny_folder / "result.json").read_text())
    assert result["suite"]["metric_family"] == "imagenet_star"
    assert "in_the_snow" in result["metrics"]["imagenet_star"]["absolute_impact"]
    assert result["flags"]["construction_model"] is False


@pytest.mark.slow
def test_resume_after_a_crash_keeps_finished_shards(tmp_path, monkeypatch):
    from genshift.suite_format import SuiteWriter

    out = tmp_path / "suite"
    real = SuiteWriter.write_shard
    calls = {"n": 0}

    def crash_on_second(self, config, index, num_shards, rows):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash")
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(SuiteWriter, "write_shard", crash_on_second)
    args = ["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress", "--images-per-shard", "2"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(args)
    staged = sorted((out / ".stage" / "data").rglob("*.parquet"))
    assert len(staged) == 1 and not list(out.rglob("*.incomplete"))  # the half-written shard is gone
    (done,) = staged
    mtime, data = done.stat().st_mtime_ns, done.read_bytes()
    regenerated = []

    def record(self, config, index, num_shards, rows):
        if self.root.name == ".stage":
            regenerated.append(self.root / shard_name(config, index, num_shards))
        else:  # filter phase: the shard finished before the crash is still the same file
            assert done.stat().st_mtime_ns == mtime and done.read_bytes() == data
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(SuiteWriter, "write_shard", record)
    assert main(args) == 0
    suite = LocalSuite.open(out)
    suite.verify()
    ids = [i for c in suite.configs for i in suite.read_columns(c, ["image_id"])["image_id"].to_pylist()]
    assert len(ids) == len(set(ids)) == 8  # no row is missing or duplicated
    n_shards = sum(len(suite.manifest.config(c).files) for c in suite.configs)
    assert done not in regenerated and len(regenerated) == n_shards - 1 >= 2


@pytest.mark.slow
def test_resume_skips_finished_stage_shards(tmp_path, monkeypatch):
    from genshift.suite_format import SuiteWriter
    out = tmp_path / "suite"
    args = ["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress", "--images-per-shard", "2"]
    real = SuiteWriter.write_shard
    seen = []

    def stop_after_stage(self, config, index, num_shards, rows):
        if self.root.name != ".stage":
            raise KeyboardInterrupt
        seen.append((config, index))
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(SuiteWriter, "write_shard", stop_after_stage)
    assert main(args) == 130  # Ctrl-C during the filter phase: the CLI exits 130, outputs kept
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / ".stage").rglob("*.parquet")}
    assert len(before) == len(seen) >= 3
    regenerated = []

    def record(self, config, index, num_shards, rows):
        if self.root.name == ".stage":
            regenerated.append((config, index))
        else:
            assert all(p.stat().st_mtime_ns == m and p.read_bytes() == b for p, (m, b) in before.items())
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(SuiteWriter, "write_shard", record)
    assert main(args) == 0
    assert regenerated == []  # every generated shard was reused, untouched


def test_wait_for_other_processes_gives_up_without_progress():
    from genshift.builders.common import wait_for as _wait_for

    left = [["a", "b"], ["b"], []]
    _wait_for(lambda: left.pop(0), "shard(s)", timeout=5, poll=0)  # progress: returns when nothing is missing
    with pytest.raises(BenchError, match="did not appear within 0 s"):
        _wait_for(lambda: ["x #3"], "generated shard(s)", timeout=0, poll=0)


def test_bad_build_input(tmp_path, capsys, monkeypatch):
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "a"), "--shifts", "in_the_snwo"]) != 0
    assert "unknown shift 'in_the_snwo'. Did you mean 'in_the_snow'" in capsys.readouterr().err
    (tmp_path / "t.zip").write_bytes(b"not a zip")
    assert main(["build", "imagenet-star", "--out", str(tmp_path / "c"), "--tokens", str(tmp_path / "t.zip"),
                 "--classes", "0", "--device", "cpu"]) != 0
    assert "is not a zip file" in capsys.readouterr().err
    assert main(["build", "imagenet-star", "--out", str(tmp_path / "c"), "--tokens", "none", "--train-tokens",
                 str(tmp_path)]) != 0
    assert "--train-tokens: give class tokens one way" in capsys.readouterr().err
    assert main(["build", "imagenet-star", "--out", str(tmp_path / "c"), "--samples-per-class", "0"]) != 0
    assert "--samples-per-class: must be at least 1, got 0" in capsys.readouterr().err
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(["build", "imagenet-star", "--out", str(tmp_path / "d"), "--classes", "0"]) != 0  # default: hub tokens
    assert "could not get tokens.zip from the Hub dataset madrylab/imagenet-star-tokens" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # nothing written before the inputs are resolved
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "e"), "--kept-fractions",
                 str(tmp_path / "t.zip")]) != 0
    assert "--kept-fractions" in capsys.readouterr().err


@pytest.mark.slow
def test_a_folder_holding_another_build_is_refused(tmp_path, capsys):
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "b"), "--no-progress", "--shifts",
                 "base", "--classes", "0", "--samples-per-class", "1"]) == 0
    capsys.readouterr()
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "b"), "--shifts", "base",
                 "--classes", "0", "--samples-per-class", "1", "--seed", "5"]) != 0
    assert "holds a different build" in capsys.readouterr().err
