"""ImageNet* builder: tokens, textual inversion, seeded generation, CLIP filter, resume, smoke suite."""

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
import torch

from benchmark.cli import main
from benchmark.errors import BenchError, IntegrityError
from benchmark.reader import LocalSuite
from builders.clip_filter import calibrate_thresholds, shift_caption
from builders.sd_generate import GenerationSettings, SDGenerator
from builders.seeding import derive_seed
from builders.tokens import inject_tokens, load_token_zip, save_token_zip, token_name

TINY = GenerationSettings(model_id="tiny", steps=2, height=64, width=64, output_size=32, batch_size=4)


@pytest.fixture(scope="module")
def smoke_suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("star") / "suite"
    assert main(["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress"]) == 0
    return out


def test_same_seed_same_bytes_and_ids_give_distinct_seeds():
    gen = SDGenerator.tiny(TINY)
    seeds = [derive_seed(0, "in_the_snow", c, k) for c in (0, 1) for k in (0, 1)]
    assert len(set(seeds)) == 4
    prompts = ["a photo of a tench in the snow"] * 4
    a = gen.generate(prompts, seeds)
    b = SDGenerator.tiny(TINY).generate(prompts, seeds)
    assert a == b  # byte-identical JPEGs on CPU
    assert len({hashlib.sha256(x).hexdigest() for x in a}) == 4
    assert gen.generate(prompts[:1], seeds[:1]) == a[:1]  # an image does not depend on its batch mates


def test_generation_backs_off_on_out_of_memory():
    gen = SDGenerator.tiny(TINY)
    real = gen.pipe.__call__
    sizes = []

    class Pipe:
        def __getattr__(self, name):
            return getattr(gen_pipe, name)

        def __call__(self, **kw):
            sizes.append(kw["latents"].shape[0])
            if kw["latents"].shape[0] > 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            return real(**kw)

    gen_pipe = gen.pipe
    gen.pipe = Pipe()
    out = gen.generate(["a"] * 3, [1, 2, 3])
    assert len(out) == 3 and gen.backoff.batch_size == 1 and sizes == [3, 2, 1, 1, 1]


def test_token_zip_round_trip_and_injection(tmp_path):
    tokens = {0: torch.randn(32), 207: torch.randn(32)}
    save_token_zip(tokens, tmp_path / "tokens.zip")
    loaded = load_token_zip(tmp_path / "tokens.zip", dim=32, classes=[0, 207])
    assert all(torch.equal(loaded[i], tokens[i]) for i in tokens)
    from builders.tiny import tiny_sd_components
    comp = tiny_sd_components()
    ids = inject_tokens(comp["tokenizer"], comp["text_encoder"], loaded)
    assert ids == {0: 49408, 207: 49409}
    assert token_name(207) == "<Golden Retriever-207>"
    assert comp["tokenizer"]("a photo of a <Golden Retriever-207>").input_ids[5] == 49409
    w = comp["text_encoder"].get_input_embeddings().weight
    assert torch.equal(w[49409], tokens[207]) and torch.equal(w[49408], tokens[0])


@pytest.mark.parametrize("tensor, match", [
    (torch.randn(2, 32), "shape \\(2, 32\\)"),
    (torch.randint(0, 5, (32,)), "not a float tensor"),
    (torch.full((32,), float("nan")), "NaN"),
])
def test_bad_token_files(tmp_path, tensor, match):
    buf = io.BytesIO()
    torch.save(tensor, buf)
    with zipfile.ZipFile(tmp_path / "t.zip", "w") as zf:
        zf.writestr("tokens/0.bin", buf.getvalue())
    with pytest.raises(IntegrityError, match=match):
        load_token_zip(tmp_path / "t.zip", dim=32, classes=[0])
    with pytest.raises(IntegrityError, match="no token for 1 class"):
        save_token_zip({0: torch.randn(32)}, tmp_path / "ok.zip")
        load_token_zip(tmp_path / "ok.zip", dim=32, classes=[0, 1])


def test_textual_inversion_lowers_the_loss_and_keeps_the_norm():
    from PIL import Image

    from builders.textual_inversion import SplitEmbedding, TIConfig, TIRun, _image_tensor, initializer, train_class_token
    from builders.tiny import tiny_sd_components

    c = tiny_sd_components()
    run = TIRun(c["unet"], c["vae"], c["text_encoder"], c["tokenizer"], c["scheduler"], torch.device("cpu"))
    rng = np.random.default_rng(0)
    imgs = [Image.fromarray(np.clip(np.full((48, 48, 3), [200, 30, 30]) + rng.normal(0, 10, (48, 48, 3)), 0, 255)
                            .astype(np.uint8)) for _ in range(4)]
    cfg = TIConfig(steps=120, lr=0.2, resolution=64, flip_p=0.0, templates=("a photo of a {}",))

    def eval_loss(vec):  # the training objective on a fixed set of (image, t, noise)
        base = run.text_encoder.get_input_embeddings()
        split = SplitEmbedding(base, run.placeholder_id, vec)
        run.text_encoder.set_input_embeddings(split)
        r = np.random.default_rng(123)
        with torch.no_grad():
            losses = [float(run.loss(split, _image_tensor(imgs[k % 4], cfg, r), "a photo of a {}",
                                     torch.tensor([int(r.integers(1000))]), 1000 + k)) for k in range(24)]
        run.text_encoder.set_input_embeddings(base)
        return np.mean(losses)

    init = initializer(run.tokenizer, run.text_encoder, "goldfish")
    vec, losses = train_class_token(run, imgs, "goldfish", cfg)
    assert torch.allclose(vec.norm(), init.norm(), rtol=1e-5)  # only the direction is learned
    trained = eval_loss(vec)
    assert trained < eval_loss(init)
    g = torch.Generator().manual_seed(0)
    randoms = [eval_loss(torch.randn(32, generator=g) * init.norm() / 32 ** 0.5) for _ in range(2)]
    assert trained < min(randoms)
    with pytest.raises(BenchError, match="has no training images"):
        train_class_token(run, [], "goldfish", cfg)


def test_calibration_hits_the_target_kept_fractions():
    rng = np.random.default_rng(0)
    scores = {"base": rng.normal(0.3, 0.05, 1000), "in_the_rain": rng.normal(0.25, 0.05, 777)}
    target = {"base": 0.9263, "in_the_rain": 0.4833}
    th = calibrate_thresholds(scores, target)
    for s, v in scores.items():
        assert (v >= th[s]).sum() == int(np.floor(v.size * target[s]))
    assert shift_caption("a photo of a <TOKEN> in the snow") == "a photo of a thing in the snow"
    assert shift_caption("a photo of a <TOKEN>") is None


def test_smoke_suite_is_valid_and_scored_by_bench_eval(smoke_suite, tmp_path, tiny_checkpoint):
    suite = LocalSuite.open(smoke_suite)
    suite.verify()
    m = suite.manifest
    assert suite.configs == ["base", "in_the_snow"] and all(c.rows == 4 for c in m.configs.values())
    assert m.configs["base"].kept == 3 and m.configs["in_the_snow"].kept == 2  # floor(4 x released fraction)
    ds = suite.dataset("in_the_snow")
    assert ds[0]["prompt"].startswith("a photo of a <") and ds[0]["prompt"].endswith("> in the snow")
    assert len(ds[0]["clip_image_embedding"]) == 32 and ds[0]["seed"] == derive_seed(0, "in_the_snow",
                                                                                       ds[0]["label"], ds[0]["sample"])
    card = (smoke_suite / "README.md").read_text()
    assert "2 steps, guidance 7.5" in card and "EulerDiscreteScheduler" in card and "0.7321" in card
    assert not (smoke_suite / ".stage").exists()
    code = main(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite",
                 str(smoke_suite), "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress"])
    assert code == 0
    result = json.loads((tmp_path / "runs/imagenet-star/test_resnet.r160_in1k/result.json").read_text())
    assert result["suite"]["metric_family"] == "imagenet_star"
    assert "in_the_snow" in result["metrics"]["imagenet_star"]["absolute_impact"]
    assert result["flags"]["construction_model"] is False


def test_resume_after_a_crash_keeps_finished_shards(tmp_path, monkeypatch):
    from benchmark import writer

    out = tmp_path / "suite"
    real = writer.SuiteWriter.write_shard
    calls = {"n": 0}

    def crash_on_second(self, config, index, num_shards, rows):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash")
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(writer.SuiteWriter, "write_shard", crash_on_second)
    args = ["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress", "--images-per-shard", "2"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(args)
    staged = sorted((out / ".stage").rglob("*.parquet"))
    assert len(staged) == 1
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in staged}
    monkeypatch.setattr(writer.SuiteWriter, "write_shard", real)
    assert main(args) == 0
    for p, (mtime, data) in before.items():
        assert not p.exists()  # the stage is removed at the end ...
    suite = LocalSuite.open(out)
    suite.verify()
    ids = [i for c in suite.configs for i in suite.read_columns(c, ["image_id"])["image_id"].to_pylist()]
    assert len(ids) == len(set(ids)) == 8  # ... and no row is missing or duplicated
    assert sum(len(suite.manifest.config(c).files) for c in suite.configs) >= 3  # the crash hit a multi-shard build


def test_resume_skips_finished_stage_shards(tmp_path, monkeypatch):
    from benchmark import writer
    out = tmp_path / "suite"
    args = ["build", "imagenet-star", "--smoke", "--out", str(out), "--no-progress", "--images-per-shard", "2"]
    real = writer.SuiteWriter.write_shard
    seen = []

    def stop_after_stage(self, config, index, num_shards, rows):
        if self.root.name != ".stage":
            raise KeyboardInterrupt
        seen.append((config, index))
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(writer.SuiteWriter, "write_shard", stop_after_stage)
    assert main(args) == 130  # Ctrl-C during the filter phase: the CLI exits 130, outputs kept
    mtimes = {p: p.stat().st_mtime_ns for p in (out / ".stage").rglob("*.parquet")}
    assert len(mtimes) == len(seen) >= 3
    regenerated = []

    def record(self, config, index, num_shards, rows):
        if self.root.name == ".stage":
            regenerated.append((config, index))
        return real(self, config, index, num_shards, rows)

    monkeypatch.setattr(writer.SuiteWriter, "write_shard", record)
    assert main(args) == 0
    assert regenerated == []  # every generated shard was reused


def test_bad_build_input(tmp_path, capsys):
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "a"), "--shifts", "in_the_snwo"]) != 0
    assert "unknown shift 'in_the_snwo'. Did you mean 'in_the_snow'" in capsys.readouterr().err
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["build", "imagenet-star", "--smoke", "--out", str(tmp_path / "b"), "--seed", "5"]) != 0
    assert "holds a different build" in capsys.readouterr().err
    (tmp_path / "t.zip").write_bytes(b"not a zip")
    assert main(["build", "imagenet-star", "--out", str(tmp_path / "c"), "--tokens", str(tmp_path / "t.zip"),
                 "--classes", "0"]) != 0
    assert "is not a zip file" in capsys.readouterr().err
