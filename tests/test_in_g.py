"""IN-G: class prompts, seed captions, failure mining, the smoke suite, and bench discover."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from genshift import imagenet
from genshift.builders.in_g import (
    CaptionResult,
    MiningConfig,
    caption_id,
    check_caption,
    class_prompt,
    mine_all,
    mine_caption,
    read_captions,
    seed_caption,
)
from genshift.cli import main
from genshift.errors import BenchError
from genshift.suite_format import LocalSuite


@pytest.mark.parametrize("wnid, text", [
    ("n02190166", "a realistic photograph of a fly (insect)."),
    ("n01985128", "a realistic photograph of a crayfish (crustacean)."),
    ("n04131690", "a realistic photograph of a saltshaker (container)."),
    ("n02165456", "a realistic photograph of a ladybug (insect)."),
    ("n02123394", "a realistic photograph of a Persian cat (domestic animal)."),
])
def test_class_prompts_reproduce_the_paper(wnid, text):
    p = class_prompt(imagenet.index_of(wnid))
    assert p.text == text
    assert p.parent_wnid.startswith("n") and imagenet.synset_name(p.parent_wnid) in text


def test_two_grandparents_and_articles():
    persian = imagenet.get_class(imagenet.index_of("n02123394"))
    assert len(persian.grandparents) == 2 and persian.parent == min(persian.grandparents)
    assert class_prompt(imagenet.index_of("n02123394")).parent_wnid == "n01317541"  # domestic_animal, min offset
    acc = imagenet.index_of("n02672831")  # accordion, two grandparents too
    assert class_prompt(acc, an=True).text.startswith("a realistic photograph of an accordion (")
    assert class_prompt(acc).text.startswith("a realistic photograph of a accordion (")


def test_seed_captions_keep_two_sentences_and_the_prefix(tmp_path):
    fly = imagenet.index_of("n02190166")
    prompt = class_prompt(fly).text
    assert seed_caption(prompt, "The background is blurred. The fly is in focus. It is on a yellow flower.") == \
        "a realistic photograph of a fly (insect). the background is blurred. the fly is in focus."
    assert seed_caption(prompt, prompt + " it is on a flower") == prompt + " it is on a flower."
    with pytest.raises(BenchError, match="does not start with its class prompt"):
        check_caption(fly, "a photo of a fly on a flower.")
    (tmp_path / "c.csv").write_text(f"class,caption\nn02190166,{prompt} it is on a flower.\n")
    assert read_captions(tmp_path / "c.csv") == [(fly, prompt + " it is on a flower.")]
    (tmp_path / "c.jsonl").write_text(json.dumps({"class": fly, "caption": prompt}) + "\n")
    assert read_captions(tmp_path / "c.jsonl")[0][0] == fly
    (tmp_path / "empty.csv").write_text("class,caption\n")
    with pytest.raises(BenchError, match="holds no captions"):
        read_captions(tmp_path / "empty.csv")
    (tmp_path / "bad.csv").write_text(f"n0000000x,{prompt}\n")
    with pytest.raises(BenchError, match="bad.csv:1: unknown ImageNet-1k wnid .n0000000x."):
        read_captions(tmp_path / "bad.csv")


def test_tiny_captioner_continues_the_forced_prefix():
    from genshift.builders.captioner import Captioner
    cap = Captioner.tiny()
    img = Image.new("RGB", (40, 40), (10, 200, 30))
    prefix = class_prompt(imagenet.index_of("n02190166")).text
    a = cap.caption([img, img], prefix=prefix, num_beams=2, min_new_tokens=3, max_new_tokens=6)
    assert all(t.startswith(prefix) and len(t) > len(prefix) for t in a)
    assert a == cap.caption([img, img], prefix=prefix, num_beams=2, min_new_tokens=3, max_new_tokens=6)
    # the GPU setting (half-precision weights; bf16 runs on CPU) captions end to end
    half = Captioner(Captioner.tiny().model.to(torch.bfloat16), cap.processor, model_id="tiny", dtype=torch.bfloat16)
    assert half.caption([img], prefix=prefix, num_beams=2, min_new_tokens=3, max_new_tokens=6)[0].startswith(prefix)


@pytest.mark.parametrize("lm", ["opt", "t5"])
def test_captioner_reads_every_new_token_of_decoder_only_and_encoder_decoder_lms(lm):
    """BLIP-2 with OPT (the output repeats the prompt) and with T5 (the output is the decoder's,
    started with the prefix): the caption is the prefix + exactly the tokens of a by-hand greedy
    decoding through the model's forward pass (slicing T5's output by the prompt length lost them)."""
    from genshift.builders.captioner import Captioner, normalize

    cap = Captioner.tiny(lm=lm)
    assert cap.is_encoder_decoder == (lm == "t5")
    img, prefix, n = Image.new("RGB", (40, 40), (10, 200, 30)), "a photo of", 5
    got = cap.caption([img], prefix=prefix, num_beams=1, min_new_tokens=n, max_new_tokens=n)[0]
    tok = cap.processor.tokenizer
    inputs = cap.processor(images=[img], text=[prefix], return_tensors="pt")
    new: list[int] = []
    with torch.no_grad():
        for _ in range(n):  # greedy; EOS barred until n tokens (min_new_tokens)
            if lm == "t5":
                start = cap.model.config.text_config.decoder_start_token_id
                dec = [start, *tok(prefix, add_special_tokens=False)["input_ids"]]
                logits = cap.model(**inputs, decoder_input_ids=torch.tensor([dec + new])).logits[0, -1]
            else:
                ids = torch.cat([inputs["input_ids"], torch.tensor([new], dtype=torch.long)], 1)
                logits = cap.model(pixel_values=inputs["pixel_values"], input_ids=ids).logits[0, -1]
            logits[tok.eos_token_id] = -float("inf")
            new.append(int(logits.argmax()))
    tail = tok.decode(new, skip_special_tokens=True).strip()
    assert tail and got == normalize(f"{prefix} {tail}")


def _fake_generate(prompts, seeds):
    out = []
    for p, s in zip(prompts, seeds):
        rng = np.random.default_rng(s)
        green = "green" in p or rng.random() < 0.1
        color = (20, 220, 20) if green else (220, 20, 20)
        buf = io.BytesIO()
        Image.new("RGB", (16, 16), color).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def _green_classifier(label, wrong):
    """Right (prob 0.9 on ``label``) unless the image is mostly green, then it says ``wrong``."""
    def classify(images):
        probs = np.full((len(images), 1000), 0.1 / 999)
        for i, b in enumerate(images):
            arr = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=float)
            green = arr[..., 1].mean() > arr[..., 0].mean()
            probs[i] = 0.1 / 999
            probs[i, wrong if green else label] = 0.9
        return probs
    return classify


def test_mining_keeps_exactly_the_failures_with_cap_and_early_stop():
    fly, tench = imagenet.index_of("n02190166"), 0  # tench is not an insect: a parent-level failure
    prompt = class_prompt(fly).text
    classify = _green_classifier(fly, tench)
    res = mine_caption(fly, prompt + " the background is green.", generate=_fake_generate, classify=classify,
                       cfg=MiningConfig(n_max=40, cap=3, batch_size=4))
    assert len(res.kept) == 3 and res.sampled == 4  # every image fails; stopped after the first batch
    assert all(a.parent_failure and a.top1_miss and a.top3_miss and a.top5_idx[0] == tench for a in res.kept)
    res = mine_caption(fly, prompt + " it is on a table.", generate=_fake_generate, classify=classify,
                       cfg=MiningConfig(n_max=40, cap=3, batch_size=4))
    # the kept ones are exactly the (green) failures among the samples drawn, in order
    from genshift.builders.seeding import derive_seed
    cid = caption_id(fly, prompt + " it is on a table.")
    green_idx = [i for i in range(40) if np.random.default_rng(derive_seed(0, cid, i)).random() < 0.1]
    assert [a.index for a in res.kept] == green_idx[:3]
    assert res.sampled == (40 if len(green_idx) < 3 else 4 * (green_idx[2] // 4 + 1))  # stops at the batch of the cap
    # a wrong prediction under the same parent is not a failure: a bee for a fly
    bee = imagenet.index_of("n02206856")
    res = mine_caption(fly, prompt + " the background is green.", generate=_fake_generate,
                       classify=_green_classifier(fly, bee), cfg=MiningConfig(n_max=8, cap=2, batch_size=4))
    assert res.kept == [] and res.sampled == 8


def test_mining_config_rejects_bad_caps():
    with pytest.raises(BenchError, match="cap must be at least 1"):
        MiningConfig(cap=0)
    with pytest.raises(BenchError, match="smaller than cap"):
        MiningConfig(n_max=2, cap=5)


def test_mining_is_deterministic_and_resumes_per_caption(tmp_path):
    fly = imagenet.index_of("n02190166")
    prompt = class_prompt(fly).text
    caps = [(fly, prompt + " the background is green."), (fly, prompt + " it is on a table.")]
    calls = []

    def gen(prompts, seeds):
        calls.append(len(prompts))
        return _fake_generate(prompts, seeds)

    cfg = MiningConfig(n_max=20, cap=2, batch_size=4)
    a = mine_all(caps, tmp_path / "w", generate=gen, classify=_green_classifier(fly, 0), cfg=cfg, progress=False)
    n_calls = len(calls)
    b = mine_all(caps, tmp_path / "w", generate=gen, classify=_green_classifier(fly, 0), cfg=cfg, progress=False)
    assert len(calls) == n_calls  # everything came from the checkpoints
    for cid in a:
        assert [x.seed for x in a[cid].kept] == [x.seed for x in b[cid].kept]
        assert [x.image for x in a[cid].kept] == [x.image for x in b[cid].kept]
    assert isinstance(CaptionResult.load(tmp_path / "w" / f"{next(iter(a))}.parquet"), CaptionResult)


@pytest.mark.slow
def test_smoke_suite_verifies_and_scores(tmp_path, tiny_checkpoint, tiny_folder):
    out = tmp_path / "ing"
    assert main(["build", "in-g-vit", "--smoke", "--out", str(out), "--no-progress"]) == 0
    suite = LocalSuite.open(out)
    suite.verify()
    ds = suite.dataset("generated")
    assert len(ds) > 0 and all(ds["parent_failure"])
    assert all(c.startswith(p) for c, p in zip(ds["caption"], ds["class_prompt"]))
    assert set(ds["label"]) <= set(imagenet.imagenet_a_indices())
    gen = suite.manifest.generator
    assert gen["yield"]["kept"] == len(ds) and gen["mining"]["cap"] == 2
    assert gen["generation"]["batch_size_effective"] == {"0": 4} and gen["determinism"]["cpu_intra_op_threads"] == 1
    assert main(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite", str(out),
                 "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress"]) == 0
    result = json.loads((tmp_path / "runs/in-g-vit" / tiny_folder / "result.json").read_text())
    rates = result["metrics"]["in_g"]["generated"]
    assert set(rates) == {"top1_error", "top3_failure_rate", "parent_failure_rate"}
    from genshift.eval.suite_trust import is_construction_model
    assert is_construction_model("timm/vit_base_patch16_224.augreg_in1k", ("vit_base_patch16_224.augreg_in1k",))
    assert not is_construction_model("timm/resnet50.a1_in1k", ("resnet50.tv_in1k",))


def test_unknown_target_and_missing_captions(tmp_path, capsys):
    assert main(["build", "in-g-rn", "--out", str(tmp_path / "a")]) != 0
    assert "give seed captions" in capsys.readouterr().err
    fly = imagenet.index_of("n02190166")
    (tmp_path / "c.csv").write_text(f"{fly},{class_prompt(fly).text} it is on a flower.\n")
    assert main(["build", "in-g-rn", "--out", str(tmp_path / "b"), "--captions", str(tmp_path / "c.csv"),
                 "--target", "resnet5O.tv_in1k", "--device", "cpu"]) != 0
    assert "unknown timm model 'resnet5O.tv_in1k'" in capsys.readouterr().err
    assert main(["build", "in-g-rn", "--out", str(tmp_path / "c"), "--captions", str(tmp_path / "c.csv"),
                 "--cap", "0"]) != 0
    assert "--cap: must be at least 1" in capsys.readouterr().err


def test_discover_finds_the_planted_green_caption():
    from genshift.builders.discover import Config as DiscoverConfig
    from genshift.builders.discover import discover

    crayfish, fence = imagenet.index_of("n01985128"), 489  # chainlink fence
    prompt = class_prompt(crayfish).text

    def caption(images, prefix):  # describes what it sees
        out = []
        for b in images:
            arr = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=float)
            green = arr[..., 1].mean() > arr[..., 0].mean()
            out.append(prefix + (" the background is green. it is in a net." if green else " it is on a table."))
        return out

    rep = discover(crayfish, generate=_fake_generate, classify=_green_classifier(crayfish, fence), caption=caption,
                   cfg=DiscoverConfig(n_baseline=80, n_per_caption=40, batch_size=8))
    assert 0 < rep["baseline"]["failures"] < 20
    best = rep["hypotheses"][0]
    assert "green" in best["caption"] and best["significant"] and best["q_value"] < 0.05 and best["ratio"] > 5
    assert all(h["q_value"] >= h["p_value"] for h in rep["hypotheses"])
    # refinement: the sentence that matters is the green one, not "in a net"
    by_text = {r["caption"]: r for r in rep["refinement"]}
    assert by_text[prompt + " the background is green."]["significant"]
    assert not by_text[prompt + " it is in a net."]["significant"]
    target = discover(crayfish, generate=_fake_generate, classify=_green_classifier(crayfish, fence), caption=caption,
                      target=fence, cfg=DiscoverConfig(n_baseline=80, n_per_caption=40, batch_size=8, refine=False))
    assert target["rate"] == "target rate" and "green" in target["hypotheses"][0]["caption"]


def test_discover_calls_significance_by_benjamini_hochberg(monkeypatch):
    from genshift.builders import discover as d
    # hand-computed: sorted p 0.01, 0.03, 0.04, 0.2 -> m p/rank 0.04, 0.06, 0.0533, 0.2 -> step-up min from the top
    assert d.bh_qvalues([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    p_of = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.2}
    seen = []  # each hypothesis gets its planted p-value
    monkeypatch.setattr(d, "_rate", lambda text, *a, **kw: (seen.append(text), (5, []))[1])
    monkeypatch.setattr(d, "_fisher", lambda k, n, k0, n0: (2.0, p_of[seen[-1]]))
    hyps = d._family(0, list(p_of), "caption", 1, target=None, generate=None, classify=None, cfg=d.Config())
    # three raw p-values are below 0.05, only one survives the false-discovery-rate control
    assert [h.significant for h in hyps] == [True, False, False, False]
    assert [round(h.q_value, 4) for h in hyps] == [0.04, 0.0533, 0.0533, 0.2]


@pytest.mark.slow
def test_discover_cli_smoke(tmp_path, capsys):
    code = main(["discover", "--model", "test_resnet.r160_in1k", "--class", "n01985128", "--smoke", "--n-baseline", "8",
                 "--n-per-caption", "4", "--max-captions", "2", "--out", str(tmp_path / "r.json")])
    assert code == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["baseline"]["n"] == 8 and rep["class_prompt"].startswith("a realistic photograph of a crayfish")


def test_captioning_is_three_shot_as_the_paper_and_recorded():
    """Sec. 3: the captioner "forces descriptive completions via few-shot prompting. In particular, we use
    three shots, with each shot being an image and caption pair. Images are publicly available online and
    are manually described using between four to seven short sentences"; "we force the captioning model to
    only consider completions to the original baseline prompt"."""
    from genshift.builders.captioner import Captioner
    from genshift.builders.in_g import shots

    few, record = shots()
    assert len(few) == 3 and [r["caption"] for r in record] == [c for _, c in few]
    for r in record:
        sentences = [s for s in r["caption"].split(". ") if s]
        assert 1 + 4 <= len(sentences) <= 1 + 7  # the class prompt, then four to seven sentences
        assert r["caption"].startswith("a realistic photograph of a ") and len(r["sha256"]) == 64
    cap = Captioner.tiny()
    prompt = class_prompt(imagenet.index_of("n02190166")).text
    images = [Image.new("RGB", (40, 40), c) for c in ((200, 0, 0), (0, 200, 0))]
    inputs = cap._few_shot_inputs(images, prompt, few)
    cfg, tok = cap.model.config, cap.processor.tokenizer
    ids = inputs["input_ids"][0].tolist()
    runs, k = [], 0
    for text in [c for _, c in few] + [prompt]:  # each image's query tokens, then its caption (last: the prompt)
        assert ids[k:k + cfg.num_query_tokens] == [cfg.image_token_id] * cfg.num_query_tokens
        k += cfg.num_query_tokens
        n = len(tok(text)["input_ids"])
        runs.append(ids[k:k + n] == tok(text)["input_ids"])
        k += n
    assert all(runs) and k == len(ids) and ids.count(cfg.image_token_id) == 4 * cfg.num_query_tokens
    # per image: the three shots' pixels, then its own
    px = inputs["pixel_values"]
    shot_px = cap.processor.image_processor([im for im, _ in few], return_tensors="pt")["pixel_values"]
    assert px.shape[0] == 8 and torch.equal(px[0:3], shot_px) and torch.equal(px[4:7], shot_px)
    assert all(c.startswith(prompt) for c in cap.caption(images, prefix=prompt, shots=few, num_beams=2,
                                                         min_new_tokens=1, max_new_tokens=6))


def test_every_images_caption_is_mined_unless_deduplicated(tmp_path):
    """Sec. 4.2: the captions "are automatically extracted from the 7,500 images of IMAGENET-A" and "for
    each caption, we sample up to a thousand images": two images with the same caption are two seed
    captions (their own ids and seeds); ``--dedup-captions`` mines a caption once."""
    fly = imagenet.index_of("n02190166")
    text = class_prompt(fly).text + " it is on a flower."
    cfg = MiningConfig(n_max=4, cap=1, batch_size=4)
    res = mine_all([(fly, text), (fly, text)], tmp_path / "w", generate=_fake_generate,
                   classify=_green_classifier(fly, 0), cfg=cfg, progress=False)
    assert list(res) == [caption_id(fly, text), caption_id(fly, text, 1)] and len(set(res)) == 2
    seeds = [[a.seed for a in r.kept] or [None] for r in res.values()]
    assert res[caption_id(fly, text)].sampled == res[caption_id(fly, text, 1)].sampled == 4 and seeds[0] != seeds[1]


@pytest.mark.slow
@pytest.mark.parametrize("n_shots, per_call", [(3, 4), (0, 16)])
def test_captioning_sends_sixteen_images_per_call_shots_included(n_shots, per_call):
    """Three-shot captioning sends each image with its three shots: 4 images per call keeps the vision model's
    batch at single-image captioning's 16, so both fit the same GPU (preflight: 13.24 vs 12.72 GiB at 24 GiB)."""
    from genshift.builders.in_g import captioner_fn

    calls = []

    class Recorder:
        def caption(self, images, *, prefix, shots, **decoding):
            calls.append((len(images), len(shots)))
            return [prefix] * len(images)

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    images = [png.getvalue()] * 17
    assert captioner_fn(Recorder(), [None] * n_shots)(images, "a photo") == ["a photo"] * 17
    assert [n for n, _ in calls] == [per_call] * (17 // per_call) + [17 % per_call]
    assert all(n * (1 + s) <= 16 for n, s in calls)


@pytest.mark.parametrize("captioning", ["three-shot", "single-image"])
def test_smoke_build_records_the_captioning(tmp_path, captioning):
    from genshift.builders.in_g import shots

    out = tmp_path / "ing"
    assert main(["build", "in-g-rn", "--smoke", "--out", str(out), "--no-progress", "--captioning", captioning]) == 0
    caps = LocalSuite.open(out).manifest.generator["captions"]
    assert caps["captioning"] == captioning and caps["deduplicated"] is False and caps["count"] == 4  # one per image
    if captioning == "three-shot":
        assert caps["shots"] == shots()[1] and "then the image to caption and its class prompt" in caps["prompt"]
    else:
        assert "shots" not in caps
