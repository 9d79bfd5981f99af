"""Seeded, batched Stable Diffusion generation (ImageNet* and IN-G builders; ``docs/builders.md``): each image's
starting latents are its own float32 CPU draw, independent of its batch, device and dtype (the UNet's CPU kernels
may still differ in the last bits with the batch size: the batch size a build ended with is recorded)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

from genshift.builders.common import loading
from genshift.builders.seeding import generator
from genshift.builders.textual_inversion import inject_tokens
from genshift.errors import BenchError
from genshift.oom import BatchBackoff

PROMPT_CACHE = 4096  # prompts whose embeddings are kept (ImageNet*: one per (shift, class))


@dataclass(frozen=True)
class GenerationSettings:
    model_id: str = "stabilityai/stable-diffusion-2"
    revision: str | None = None
    scheduler: str = "euler"            # "euler" (ImageNet*: EulerDiscrete) | "default" (the checkpoint's)
    steps: int = 50
    guidance: float = 7.5
    height: int = 768
    width: int = 768
    output_size: int = 512              # stored size (square)
    jpeg_quality: int = 95
    dtype: str = "float16"              # UNet/VAE on CUDA; CPU always runs float32; text encoder float32
    batch_size: int = 8
    variant: str | None = None          # Hub weight variant to download ("fp16" halves the download)

    def __post_init__(self) -> None:
        if self.height % 8 or self.width % 8:
            raise BenchError(f"height and width must be multiples of 8, got {self.height}x{self.width}")
        if not 1 <= self.jpeg_quality <= 100:
            raise BenchError(f"JPEG quality must be in 1..100, got {self.jpeg_quality}")


class SDGenerator:
    """A Stable Diffusion pipeline (``pipe``, text encoder included) and its settings; :meth:`generate` runs
    a text-encoder-less view of its modules (:attr:`denoiser`) on cached, dtype-cast prompt embeddings."""

    def __init__(self, pipe, settings: GenerationSettings, *, device: str = "cpu", tokens: dict | None = None) -> None:
        if settings.scheduler == "euler":
            pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        if tokens:
            inject_tokens(pipe.tokenizer, pipe.text_encoder, tokens)
        pipe.set_progress_bar_config(disable=True)
        pipe.to(device)
        self.pipe = pipe
        self.settings = settings
        self.device = torch.device(device)
        self.backoff = BatchBackoff(settings.batch_size, what="generation batch")
        self._embeds: dict[str, torch.Tensor] = {}
        # the UNet, VAE and scheduler without a text encoder, taking embeddings as given (with one, diffusers
        # casts ``prompt_embeds`` back to its float32, which a fp16/bf16 UNet rejects)
        self.denoiser = StableDiffusionPipeline(vae=pipe.vae, text_encoder=None, tokenizer=None, unet=pipe.unet,
                                                scheduler=pipe.scheduler, safety_checker=None, feature_extractor=None,
                                                requires_safety_checker=False)
        self.denoiser.set_progress_bar_config(disable=True)
        self.resolved_revision: str | None = settings.revision

    @classmethod
    def from_pretrained(cls, settings: GenerationSettings, *, device: str = "cpu", tokens: dict | None = None):
        cuda = device.startswith("cuda")
        dtype = getattr(torch, settings.dtype) if cuda else torch.float32
        with loading(settings.model_id, "check the model id and that the weights are cached or the Hub reachable"):
            pipe = StableDiffusionPipeline.from_pretrained(settings.model_id, revision=settings.revision,
                                                           variant=settings.variant, torch_dtype=dtype,
                                                           safety_checker=None, requires_safety_checker=False)
        pipe.text_encoder.to(torch.float32)  # fp32 text encoder under fp16 UNet/VAE, as the authors' build
        gen = cls(pipe, settings, device=device, tokens=tokens)
        snapshot = re.search(r"snapshots[/\\]([0-9a-f]{40})", str(getattr(pipe.unet.config, "_name_or_path", "")))
        gen.resolved_revision = snapshot.group(1) if snapshot else settings.revision  # the Hub cache's commit
        return gen

    @classmethod
    def tiny(cls, settings: GenerationSettings, *, prediction_type: str = "v_prediction", tokens: dict | None = None):
        """The same pipeline on tiny random-weight components (``--smoke`` and tests; CPU)."""
        from genshift.builders.real_models import tiny_sd_components

        return cls.from_components(tiny_sd_components(prediction_type=prediction_type), settings, tokens=tokens)

    @classmethod
    def from_components(cls, components: dict, settings: GenerationSettings, *, device: str = "cpu",
                        tokens: dict | None = None):
        pipe = StableDiffusionPipeline(**components, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
        return cls(pipe, settings, device=device, tokens=tokens)

    @torch.inference_mode()
    def encode_prompts(self, prompts: Sequence[str]) -> torch.Tensor:
        """Text embeddings ``(n, 77, d)`` in the UNet's dtype; every distinct prompt is encoded once."""
        todo = [p for p in dict.fromkeys(prompts) if p not in self._embeds]
        if todo:
            emb, _ = self.pipe.encode_prompt(todo, self.device, 1, False)
            if len(self._embeds) + len(todo) > PROMPT_CACHE:
                self._embeds.clear()
            self._embeds.update(zip(todo, emb.to(self.pipe.unet.dtype)))
        return torch.stack([self._embeds[p] for p in prompts])

    def initial_latents(self, seeds: Sequence[int]) -> torch.Tensor:
        """One float32 CPU draw per seed (identical on any device and batch), in the UNet's dtype."""
        f = self.pipe.vae_scale_factor
        shape = (self.pipe.unet.config.in_channels, self.settings.height // f, self.settings.width // f)
        draws = [torch.randn(shape, generator=generator(s, "cpu"), dtype=torch.float32) for s in seeds]
        return torch.stack(draws).to(self.device, self.pipe.unet.dtype)

    def _batch(self, items: Sequence[tuple[str, int]]) -> list[bytes]:
        from PIL import Image

        s = self.settings
        seeds = [seed for _, seed in items]
        cond = self.encode_prompts([p for p, _ in items])
        uncond = self.encode_prompts([""] * len(items))  # no negative prompt: the empty prompt
        with torch.inference_mode():
            out = self.denoiser(prompt_embeds=cond, negative_prompt_embeds=uncond, latents=self.initial_latents(seeds),
                                num_inference_steps=s.steps, guidance_scale=s.guidance, height=s.height,
                                width=s.width, generator=[generator(x, "cpu") for x in seeds], output_type="pil")
        result = []
        for im in out.images:
            if im.size != (s.output_size, s.output_size):
                im = im.resize((s.output_size, s.output_size), Image.BICUBIC)
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=s.jpeg_quality)
            result.append(buf.getvalue())
        return result

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[bytes]:
        """JPEG bytes of one image per (prompt, seed), batched with out-of-memory back-off."""
        return self.backoff.call(self._batch, list(zip(prompts, seeds)))

    def provenance(self) -> dict:
        import diffusers

        return {**asdict(self.settings), "resolved_revision": self.resolved_revision,
                "pipeline": type(self.pipe).__name__, "scheduler_class": type(self.pipe.scheduler).__name__,
                "attention": "SDPA (diffusers AttnProcessor2_0)", "diffusers": diffusers.__version__,
                "unet_dtype": str(self.pipe.unet.dtype), "text_encoder_dtype": str(self.pipe.text_encoder.dtype),
                "noise": "float32 CPU torch.Generator(seed) per image", "negative_prompt": ""}
