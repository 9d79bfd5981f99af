"""The real architectures of the builders' models (published configs, meta device) and `bench build --preflight`.

The parameter counts below are held out: published figures, not derived from the shipped configs.
"""

import re

import pytest
import torch
import torch.nn.functional as F

from genshift.builders import preflight as pf
from genshift.builders import real_models as rm
from genshift.cli import main

# published parameter counts (model cards / papers / the libraries' own tables)
SD2_UNET = 865_910_724        # stabilityai/stable-diffusion-2(-1-base) unet
SD1_UNET = 859_520_964        # CompVis/stable-diffusion-v1-4 unet
SD_VAE = 83_653_863           # AutoencoderKL of SD 1.x / 2.x
OPENCLIP_H_TEXT = 340_387_840  # SD 2 text encoder (OpenCLIP ViT-H/14 text tower, 23 layers)
CLIP_L_TEXT = 123_060_480     # openai/clip-vit-large-patch14 text model
OPT_2_7B = 2_651_596_800      # facebook/opt-2.7b (BLIP-2's language model)
LLAMA_7B = 6_738_415_616      # LLaMA-7B
RESNET50 = 25_557_032
VIT_B16 = 86_567_656


def _sd(model_id):
    c = rm.stable_diffusion(model_id)
    return {k: rm.param_count(c[k]) for k in ("unet", "vae", "text_encoder")}


@pytest.mark.parametrize("model_id, unet, text", [
    ("stabilityai/stable-diffusion-2", SD2_UNET, OPENCLIP_H_TEXT),
    ("stabilityai/stable-diffusion-2-1-base", SD2_UNET, OPENCLIP_H_TEXT),
    ("CompVis/stable-diffusion-v1-4", SD1_UNET, CLIP_L_TEXT),
])
def test_stable_diffusion_configs_have_the_published_sizes(model_id, unet, text):
    assert _sd(model_id) == {"unet": unet, "vae": SD_VAE, "text_encoder": text}
    c = rm.stable_diffusion(model_id)
    assert c["unet"].device.type == "meta" and c["text_encoder"].device.type == "meta"  # no memory spent
    assert c["unet"].config.cross_attention_dim == c["text_encoder"].config.hidden_size


def test_language_and_vision_models_have_the_published_sizes():
    for cap in ("Salesforce/blip2-opt-2.7b", "Salesforce/blip2-opt-2.7b-coco"):
        assert rm.param_count(rm.blip2(cap).language_model) == OPT_2_7B
    assert rm.param_count(rm.causal_lm("lance-release")) == LLAMA_7B  # through our lit-llama conversion
    qwen = rm.causal_lm("Qwen/Qwen2.5-7B-Instruct")  # Qwen2.5 report: 7.61 B, 6.53 B without the embeddings
    embeddings = qwen.get_input_embeddings().weight.numel() + qwen.get_output_embeddings().weight.numel()
    assert abs(rm.param_count(qwen) / 1e9 - 7.61) < 0.01 and round((rm.param_count(qwen) - embeddings) / 1e9, 2) == 6.53
    # open_clip's model profile table: ViT-H-14 986.11 M, ViT-L-14 427.62 M
    assert round(rm.param_count(rm.open_clip_model("ViT-H-14")[0]) / 1e6, 2) == 986.11
    assert round(rm.param_count(rm.open_clip_model("ViT-L-14")[0]) / 1e6, 2) == 427.62
    assert rm.param_count(rm.timm_model("resnet50.tv_in1k")) == RESNET50
    assert rm.param_count(rm.timm_model("vit_base_patch16_224.augreg_in1k")) == VIT_B16


def test_every_shipped_config_names_its_source():
    for model_id, s in rm.published().items():
        assert s["source"]["repo"], model_id
        files = [c["file"] for c in s.get("components", {}).values()] or [s["source"]["file"]]
        assert all(files), model_id


def test_live_bytes_on_a_hand_computed_case():
    """Linear 1000 -> 1000 (fp32) on 10 rows: weights 4,004,000 bytes; the input (40,000) and the
    output (40,000) are alive together; a 1000 x 1000 attention (4 MB) is not counted when fused."""
    probe = pf.Report("linear", "lin")
    with pf.FusedAttention(), probe.mem, torch.no_grad():
        with torch.device("meta"):
            lin = torch.nn.Linear(1000, 1000)
        probe.built(lin=lin)
        x = torch.empty(10, 1000, device="meta")
        y = lin(x)
        q = torch.empty(1, 1, 1000, 64, device="meta")
        out = F.scaled_dot_product_attention(q, q, q)
    assert probe.weights == 4_004_000 and probe.params == 1_001_000
    assert y.shape == (10, 1000) and out.shape == (1, 1, 1000, 64)
    # x, y, q, out; no L x S matrix
    assert probe.weights + probe.mem.peak == 4_004_000 + 40_000 + 40_000 + 256_000 + 256_000


def test_models_loaded_at_once_add_their_weights_per_stage_group():
    """LANCE holds one stage's models at a time (genshift.builders.lance): the captioner, then the perturber (with CLIP
    for the CLIP text filter), then the editor with CLIP; the largest of these sets is what must fit. ImageNet*
    holds its generator and CLIP together."""
    from types import SimpleNamespace

    reports = [pf.Report("caption", "a", weights=4 * pf.GiB, peak=5 * pf.GiB),
               pf.Report("perturbation prompting", "b", weights=14 * pf.GiB, peak=14 * pf.GiB + 2 ** 20),
               pf.Report("NTI + P2P editing", "c", weights=4 * pf.GiB, peak=9 * pf.GiB),
               pf.Report("CLIP checks", "d", weights=pf.GiB, peak=pf.GiB)]
    names, peak = pf.together("lance-hardimagenet", reports)
    assert names == ["perturbation prompting"] and peak == 14 * pf.GiB + 2 ** 20  # not the 28 GiB of all four
    names, peak = pf.together("lance-hardimagenet", reports, SimpleNamespace(text_filter="clip"))
    assert names == ["perturbation prompting", "CLIP checks"] and peak == 15 * pf.GiB + 2 ** 20
    reports[1].weights = reports[1].peak = 2 * pf.GiB  # a small LLM: the editor with CLIP is the largest set
    assert pf.together("lance-hardimagenet", reports) == (["NTI + P2P editing", "CLIP checks"], 10 * pf.GiB)
    text = pf.render("lance-hardimagenet", reports, "cuda", "8 GiB", capacity=8 * pf.GiB)
    assert "most loaded at once (NTI + P2P editing, CLIP checks): 10.00 GiB; does NOT fit" in text
    assert "; fits" in pf.render("lance-hardimagenet", reports, "cuda", "24 GiB", capacity=24 * pf.GiB)
    star = [pf.Report("generation", "g", weights=3 * pf.GiB, peak=8 * pf.GiB), pf.Report("CLIP filter", "c",
                                                                                       weights=pf.GiB, peak=2 * pf.GiB)]
    assert pf.together("imagenet-star", star) == (["generation", "CLIP filter"], 9 * pf.GiB)


SUITES = {
    "imagenet-star": [("stabilityai/stable-diffusion-2", [SD2_UNET, SD_VAE, OPENCLIP_H_TEXT]),
                      ("open_clip:ViT-H-14", [986_109_441])],
    "lance-hardimagenet": [("Salesforce/blip2-opt-2.7b-coco", [OPT_2_7B]),
                           ("CompVis/stable-diffusion-v1-4", [SD1_UNET, SD_VAE, CLIP_L_TEXT]),
                           ("Qwen/Qwen2.5-7B-Instruct", []), ("open_clip:ViT-L-14", [427_616_513])],
    "in-g-rn": [("Salesforce/blip2-opt-2.7b", [OPT_2_7B]), ("stabilityai/stable-diffusion-2-1-base",
                                                            [SD2_UNET, SD_VAE, OPENCLIP_H_TEXT]),
                ("timm:resnet50.tv_in1k", [RESNET50])],
}
EVIDENCE = {
    "imagenet-star": ["gradient reaches the learned row (1024,)", "class tokens injected as ids 49408..50407",
                      "prompt embeddings (2, 77, 1024)", "latents (2, 4, 96, 96)", "decoded images 768x768",
                      "image and text embeddings of width 1024"],
    "lance-hardimagenet": ["32 queries (1 image(s)) projected to the LM width 2560", "7 branches in one pass",
                           "controller ran on all 32 attention layers (16 cross) every step", "next-token logits",
                           "null-text embedding optimised", "image and text embeddings of width 768",
                           "most loaded at once (caption): 14.55 GiB"],  # one stage at a time; fp32 on CPU
    # three-shot captioning: the three shot images' queries before the image's own
    "in-g-rn": ["128 queries (4 image(s)) projected to the LM width 2560", "latents (2, 4, 64, 64)",
                "decoded images 512x512", "224 px input -> 1000 logits"],
}


@pytest.mark.slow
@pytest.mark.parametrize("suite", list(SUITES))
def test_preflight_passes_every_stage_of_the_real_architectures(suite, capsys):
    batch = [] if suite == "lance-hardimagenet" else ["--batch-size", "2"]  # LANCE works image by image
    assert main(["build", suite, "--preflight", "--device", "cpu", *batch]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out
    counts = [int(n.replace(",", "")) for n in re.findall(r"\b\d{1,3}(?:,\d{3})+\b", out)]
    for model, published in SUITES[suite]:
        assert model in out
        for n in published:
            assert n in counts, (model, n)
    for evidence in EVIDENCE[suite]:
        assert evidence in out, evidence


def test_a_shape_mismatch_fails_the_preflight(monkeypatch, capsys):
    """An SD 2 whose UNet expects 768-wide text (SD 1's) with SD 2's 1024-wide encoder: the generation
    stage fails its pass, the others still run, the exit code is non-zero."""
    import copy

    table = copy.deepcopy(rm.published())
    table["stabilityai/stable-diffusion-2"]["components"]["unet"]["config"]["cross_attention_dim"] = 768
    monkeypatch.setattr(rm, "published", lambda: table)
    assert main(["build", "in-g-rn", "--preflight", "--device", "cpu", "--generator", "stabilityai/stable-diffusion-2",
                 "--size", "256", "--batch-size", "1"]) != 0
    cap = capsys.readouterr()
    assert re.search(r"generation +stabilityai/stable-diffusion-2 +FAILED: RuntimeError: .*768", cap.out)
    assert "timm:resnet50.tv_in1k" in cap.out and "224 px input -> 1000 logits" in cap.out
    assert "1 stage(s) failed their shape pass (generation)" in cap.err


def test_unknown_model_and_missing_out(capsys):
    assert main(["build", "in-g-rn", "--preflight", "--device", "cpu", "--captioner", "me/blip9", "--size", "256",
                 "--batch-size", "1"]) != 0
    assert re.search(r"caption.*me/blip9 +FAILED: NotFoundError: unknown model with a shipped config 'me/blip9'",
                     capsys.readouterr().out)
    assert main(["build", "in-g-rn", "--captions", "x.csv"]) != 0
    assert "--out is required" in capsys.readouterr().err
