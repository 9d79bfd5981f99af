"""The real architectures of the builders' default models with random weights, from the published configs in
``builders/_data/real_models.json`` or open_clip's and timm's registries, built under ``torch.device(device)``
(on ``"meta"`` a 7B model costs no memory)."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from pydoc import locate

import torch

from genshift.errors import BenchError, unknown

DATA = Path(__file__).parent / "_data" / "real_models.json"


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


def stable_diffusion(model_id: str, *, device: str = "meta", dtype: torch.dtype = torch.float32,
                     text_encoder_dtype: torch.dtype = torch.float32) -> dict:
    """UNet, VAE, text encoder (random weights), tokenizer and scheduler of a Stable Diffusion
    checkpoint, as ``StableDiffusionPipeline(**components)`` takes them."""
    from transformers import CLIPTextConfig

    from genshift.builders.tiny import clip_tokenizer

    s = spec(model_id, "stable-diffusion")
    c = s["components"]
    with building(device, dtype):
        unet = locate(c["unet"]["class"]).from_config(c["unet"]["config"])
        vae = locate(c["vae"]["class"]).from_config(c["vae"]["config"])
    with building(device, text_encoder_dtype):
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
