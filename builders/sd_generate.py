"""Seeded, batched Stable Diffusion generation (ImageNet* and IN-G builders).

Every image has its own ``torch.Generator`` seeded from its ids (``builders.seeding``), so an
image does not depend on which other images share its batch's random draws. Generation runs in
batches with the pipeline's default SDPA attention and fp16/bf16 weights on GPU (the text encoder
stays fp32, as the authors' ImageNet* build requires), backs off the batch size on out-of-memory,
and returns stored-size JPEG bytes (PIL bicubic resize, recorded quality).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from benchmark.errors import BenchError
from benchmark.oom import BatchBackoff
from builders.seeding import generator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationSettings:
    model_id: str = "stabilityai/stable-diffusion-2"
    revision: str | None = None
    scheduler: str = "euler"            # "euler" (ImageNet*: EulerDiscrete) | "ddim" | "default"
    steps: int = 50
    guidance: float = 7.5
    height: int = 768
    width: int = 768
    output_size: int = 512              # stored size (square)
    jpeg_quality: int = 95
    dtype: str = "float16"              # on CUDA; CPU always runs float32
    batch_size: int = 8

    def to_dict(self) -> dict:
        return asdict(self)


class SDGenerator:
    """A Stable Diffusion pipeline plus the settings it is run with."""

    def __init__(self, pipe, settings: GenerationSettings, *, device: str = "cpu") -> None:
        self.pipe = pipe
        self.settings = settings
        self.device = torch.device(device)
        self.backoff = BatchBackoff(settings.batch_size, what="generation batch")
        if settings.height % 8 or settings.width % 8:
            raise BenchError(f"height and width must be multiples of 8, got {settings.height}x{settings.width}")

    @classmethod
    def from_pretrained(cls, settings: GenerationSettings, *, device: str = "cpu", tokens: dict | None = None):
        """Load the pipeline (weights from the Hub cache); inject class tokens if given."""
        from diffusers import StableDiffusionPipeline

        cuda = device.startswith("cuda")
        dtype = getattr(torch, settings.dtype) if cuda else torch.float32
        try:
            pipe = StableDiffusionPipeline.from_pretrained(settings.model_id, revision=settings.revision,
                                                           torch_dtype=dtype, safety_checker=None,
                                                           requires_safety_checker=False)
        except (OSError, ValueError) as e:
            raise BenchError(f"cannot load {settings.model_id}: {str(e).splitlines()[0]}; check the model id and "
                             "that the weights are cached or the Hub reachable") from None
        pipe.text_encoder.to(torch.float32)  # fp32 text encoder under fp16 UNet/VAE (specs/imagenet_star.md s1)
        return cls._finish(pipe, settings, device=device, tokens=tokens)

    @classmethod
    def tiny(cls, settings: GenerationSettings, *, seed: int = 0, prediction_type: str = "v_prediction",
             tokens: dict | None = None):
        """The same pipeline on tiny random-weight components (``--smoke`` and tests; CPU)."""
        from diffusers import StableDiffusionPipeline

        from builders.tiny import tiny_sd_components

        pipe = StableDiffusionPipeline(**tiny_sd_components(seed=seed, prediction_type=prediction_type),
                                       safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        return cls._finish(pipe, settings, device="cpu", tokens=tokens)

    @classmethod
    def _finish(cls, pipe, settings: GenerationSettings, *, device: str, tokens: dict | None):
        from diffusers import DDIMScheduler, EulerDiscreteScheduler

        if settings.scheduler == "euler":
            pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        elif settings.scheduler == "ddim":
            pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        elif settings.scheduler != "default":
            raise BenchError(f"unknown scheduler {settings.scheduler!r}; use euler, ddim or default")
        if tokens:
            from builders.tokens import inject_tokens
            inject_tokens(pipe.tokenizer, pipe.text_encoder, tokens)
        pipe.set_progress_bar_config(disable=True)
        pipe.to(device)
        return cls(pipe, settings, device=device)

    def _encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt and empty-prompt embeddings from the (fp32) text encoder, cast to the UNet dtype."""
        pe, ne = self.pipe.encode_prompt(list(prompts), self.device, 1, True, negative_prompt=None)
        dtype = self.pipe.unet.dtype
        return pe.to(dtype), ne.to(dtype)

    def _batch(self, items: Sequence[tuple[str, int]]) -> list[bytes]:
        from PIL import Image

        prompts = [p for p, _ in items]
        gens = [generator(s, "cpu") for _, s in items]  # CPU generators: identical latents on any device
        shape = (len(items), self.pipe.unet.config.in_channels, self.settings.height // self.pipe.vae_scale_factor,
                 self.settings.width // self.pipe.vae_scale_factor)
        latents = torch.stack([torch.randn(shape[1:], generator=g) for g in gens]).to(self.device, self.pipe.unet.dtype)
        pe, ne = self._encode_prompts(prompts)
        with torch.inference_mode():
            out = self.pipe(prompt_embeds=pe, negative_prompt_embeds=ne, latents=latents,
                            num_inference_steps=self.settings.steps, guidance_scale=self.settings.guidance,
                            height=self.settings.height, width=self.settings.width, output_type="pil")
        result = []
        for im in out.images:
            if im.size != (self.settings.output_size, self.settings.output_size):
                im = im.resize((self.settings.output_size, self.settings.output_size), Image.BICUBIC)
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=self.settings.jpeg_quality)
            result.append(buf.getvalue())
        return result

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[bytes]:
        """JPEG bytes of one image per (prompt, seed), batched with out-of-memory back-off."""
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        return self.backoff.call(self._batch, list(zip(prompts, seeds)))

    def provenance(self) -> dict:
        import diffusers

        return {**self.settings.to_dict(), "pipeline": type(self.pipe).__name__,
                "scheduler_class": type(self.pipe.scheduler).__name__,
                "attention": "SDPA (diffusers AttnProcessor2_0)", "diffusers": diffusers.__version__,
                "unet_dtype": str(self.pipe.unet.dtype), "text_encoder_dtype": str(self.pipe.text_encoder.dtype)}
