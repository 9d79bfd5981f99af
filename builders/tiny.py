"""Tiny random-weight models built from configs, each after ``torch.manual_seed(seed)``, for ``--smoke`` runs and
tests (no network); the real code paths run on them unchanged."""

from __future__ import annotations

import gzip
import json
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

TINY_TEXT_DIM = 32


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
