"""Models built from configs, with random weights: the real architectures of the builders' default models, from
the published configs in ``builders/_data/real_models.json`` or open_clip's and timm's registries, built under
``torch.device(device)`` (on ``"meta"`` a 7B model costs no memory); and tiny ones, each after
``torch.manual_seed(seed)``, for ``--smoke`` runs and tests (no network; the real code paths run on them unchanged).
"""

from __future__ import annotations

import gzip
import json
import logging
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from pydoc import locate

import torch

from genshift.errors import BenchError, unknown

DATA = Path(__file__).parent / "_data" / "real_models.json"
TINY_TEXT_DIM = 32


@lru_cache(maxsize=1)
def published() -> dict[str, dict]:
    """``{model id: spec}`` of the Hub models whose configs ship with the package."""
    return json.loads(DATA.read_text(encoding="utf-8"))["models"]


def spec(model_id: str, kind: str | None = None, hint: str = "") -> dict:
    """The shipped spec of ``model_id``, which must be a ``kind`` model when given."""
    table = published()
    if model_id not in table:
        raise unknown("model with a shipped config", model_id, table)
    if kind is not None and table[model_id]["kind"] != kind:
        raise BenchError(f"{model_id} is a {table[model_id]['kind']} model, not {kind}{hint}")
    return table[model_id]


def param_count(*modules: torch.nn.Module) -> int:
    """Parameters of the modules, each tensor counted once (tied weights are one tensor)."""
    return sum({id(p): p.numel() for m in modules for p in m.parameters()}.values())


@contextmanager
def building(device: str, dtype: torch.dtype):
    """Create tensors on ``device`` in ``dtype`` (a 7B model in bf16 never exists in fp32 first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def stable_diffusion(model_id: str, *, device: str = "meta", dtype: torch.dtype = torch.float32) -> dict:
    """UNet, VAE, text encoder (random weights; float32, as the builders run it), tokenizer and scheduler of a
    Stable Diffusion checkpoint, as ``StableDiffusionPipeline(**components)`` takes them."""
    from transformers import CLIPTextConfig


    s = spec(model_id, "stable-diffusion")
    c = s["components"]
    with building(device, dtype):
        unet = locate(c["unet"]["class"]).from_config(c["unet"]["config"])
        vae = locate(c["vae"]["class"]).from_config(c["vae"]["config"])
    with building(device, torch.float32):
        text_encoder = locate(c["text_encoder"]["class"])(CLIPTextConfig(**c["text_encoder"]["config"]))
    scheduler = locate(s["scheduler"]["class"]).from_config(s["scheduler"]["config"])
    tok = s["tokenizer"]
    return {"unet": unet.eval(), "vae": vae.eval(), "text_encoder": text_encoder.eval(), "scheduler": scheduler,
            "tokenizer": clip_tokenizer(model_max_length=tok["model_max_length"], pad_token=tok["pad_token"])}


def blip2(model_id: str, *, device: str = "meta", dtype: torch.dtype = torch.float32):
    from transformers import Blip2Config, Blip2ForConditionalGeneration

    s = spec(model_id, "blip2", "; give a Salesforce/blip2-* captioner")
    with building(device, dtype):
        model = Blip2ForConditionalGeneration(Blip2Config(**s["config"])).eval()
    for name in getattr(model, "_keep_in_fp32_modules", None) or []:  # as from_pretrained keeps them
        part = getattr(model, name)
        if isinstance(part, torch.nn.Parameter):
            part.data = part.data.float()
        else:
            part.float()
    return model


def causal_lm(model_id: str, *, device: str = "meta", dtype: torch.dtype = torch.float32):
    """The perturber LLM (``lance-release``: LLaMA-7B as ``genshift.builders.lance_litllama`` converts it)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(spec(model_id, "causal-lm")["config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with building(device, dtype):
        return AutoModelForCausalLM.from_config(config).eval()


def open_clip_model(name: str, *, device: str = "meta", dtype: torch.dtype = torch.float32):
    """(model, eval preprocess, tokenizer) of an open_clip architecture from open_clip's registry."""
    import open_clip
    from open_clip.transform import image_transform

    if name not in open_clip.list_models():
        raise unknown("open_clip architecture", name, open_clip.list_models())
    quiet = logging.root.manager.disable
    logging.disable(logging.WARNING)  # open_clip narrates every step (and "no pretrained weights") on the root logger
    try:
        with building(device, dtype):
            model = open_clip.create_model(name, pretrained=None, device=device).eval()
        tokenizer = open_clip.get_tokenizer(name)
    finally:
        logging.disable(quiet)
    size = model.visual.image_size
    preprocess = image_transform(size if isinstance(size, int) else size[0], is_train=False)
    return model, preprocess, tokenizer


def timm_model(name: str, *, device: str = "meta", dtype: torch.dtype = torch.float32):
    """A timm model from timm's registry (architecture only; ``pretrained=False`` downloads nothing)."""
    import timm

    with building(device, dtype):
        return timm.create_model(name, pretrained=False).eval()


@lru_cache(maxsize=1)
def clip_bpe_files() -> tuple[str, str]:
    """Paths of ``vocab.json`` + ``merges.txt`` of the CLIP BPE (49,408 tokens), derived from open_clip's
    vocabulary file as its ``SimpleTokenizer`` does; the two special tokens get transformers' names."""
    import open_clip.tokenizer as oct

    merges = gzip.open(oct.default_bpe()).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    byte_units = list(oct.bytes_to_unicode().values())
    vocab = byte_units + [v + "</w>" for v in byte_units] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out = Path(tempfile.mkdtemp(prefix="genshift-clip-bpe-"))
    (out / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return str(out / "vocab.json"), str(out / "merges.txt")


def clip_tokenizer(*, model_max_length: int = 77, pad_token: str = "<|endoftext|>"):
    """The slow CLIP tokenizer of Stable Diffusion, built offline (SD 2's pads with ``"!"``)."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_bpe_files()
    return CLIPTokenizer(vocab, merges, model_max_length=model_max_length, pad_token=pad_token)


def tiny_sd_components(*, seed: int = 0, prediction_type: str = "v_prediction", sample_size: int = 32) -> dict:
    """UNet, VAE, text encoder, tokenizer and scheduler of a tiny Stable Diffusion: ``v_prediction`` + Euler as
    SD 2 (ImageNet*), ``epsilon`` + DDIM as SD 1.4 (LANCE). The VAE downsamples by 2: 32-px latents, 64-px images."""
    from diffusers import AutoencoderKL, DDIMScheduler, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=sample_size, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=TINY_TEXT_DIM,
                                attention_head_dim=(2, 4), use_linear_projection=True, norm_num_groups=8)
    torch.manual_seed(seed)
    vae = AutoencoderKL(block_out_channels=(16, 32), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"), norm_num_groups=8,
                        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), sample_size=sample_size * 2)
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        bos_token_id=49406, eos_token_id=49407, hidden_size=TINY_TEXT_DIM, intermediate_size=37, layer_norm_eps=1e-05,
        num_attention_heads=4, num_hidden_layers=2, pad_token_id=1, vocab_size=49408, projection_dim=TINY_TEXT_DIM,
        hidden_act="gelu"))
    sd2 = prediction_type == "v_prediction"  # SD 2's tokenizer pads with "!"
    kw = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", prediction_type=prediction_type,
              steps_offset=1)
    scheduler = EulerDiscreteScheduler(**kw) if sd2 else DDIMScheduler(clip_sample=False, set_alpha_to_one=False, **kw)
    return {"unet": unet.eval(), "vae": vae.eval(), "text_encoder": text_encoder.eval(), "scheduler": scheduler,
            "tokenizer": clip_tokenizer(pad_token="!" if sd2 else "<|endoftext|>")}


def tiny_open_clip(*, seed: int = 0, image_size: int = 32):
    """A tiny open_clip ``CLIP`` (random weights; the classes and text path of ViT-H-14 / ViT-L-14), its eval
    preprocess and tokenizer."""
    import open_clip
    from open_clip.transform import image_transform

    torch.manual_seed(seed)
    model = open_clip.CLIP(
        embed_dim=32,
        vision_cfg={"image_size": image_size, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
        text_cfg={"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
    ).eval()
    preprocess = image_transform(image_size, is_train=False)
    tokenizer = open_clip.tokenizer.SimpleTokenizer()
    return model, preprocess, tokenizer
