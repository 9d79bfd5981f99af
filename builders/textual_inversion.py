"""Textual inversion: learn one token per class (a "dataset interface" for any image collection).

The settings of Dataset Interfaces (``specs/imagenet_star.md`` s1), all overridable: 3000 steps,
AdamW lr 5e-4 (constant, betas 0.9/0.999, weight decay 1e-2, eps 1e-8), batch 1, 768 px centre
crop + bicubic resize + horizontal flip, the 27 standard textual-inversion object templates, the
velocity target for v-prediction models (noise for epsilon models), t uniform over the training
timesteps, latents = VAE sample x scaling factor. The token starts at the mean of the class name's
sub-word embeddings and only its **direction** is learned: the "SplitEmbedding" trick rescales the
one trainable row to the initializer's norm in every forward pass, with the rest of the table frozen.

Training is resumable per class: each finished token is written atomically and skipped on rerun.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmark import imagenet
from benchmark.errors import BenchError
from benchmark.fsutil import atomic_path

log = logging.getLogger(__name__)
PLACEHOLDER = "<genshift-ti-placeholder>"
TEMPLATES = (
    "a photo of a {}", "a rendering of a {}", "a cropped photo of the {}", "the photo of a {}",
    "a photo of a clean {}", "a photo of a dirty {}", "a dark photo of the {}", "a photo of my {}",
    "a photo of the cool {}", "a close-up photo of a {}", "a bright photo of the {}", "a cropped photo of a {}",
    "a photo of the {}", "a good photo of the {}", "a photo of one {}", "a close-up photo of the {}",
    "a rendition of the {}", "a photo of the clean {}", "a rendition of a {}", "a photo of a nice {}",
    "a good photo of a {}", "a photo of the nice {}", "a photo of the small {}", "a photo of the weird {}",
    "a photo of the large {}", "a photo of a cool {}", "a photo of a small {}",
)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".JPEG"}


@dataclass(frozen=True)
class TIConfig:
    steps: int = 3000
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 1e-2
    eps: float = 1e-8
    resolution: int = 768
    flip_p: float = 0.5
    templates: tuple[str, ...] = TEMPLATES
    seed: int = 0


class SplitEmbedding(torch.nn.Module):
    """A frozen token-embedding table plus one trainable row, rescaled to a fixed norm."""

    def __init__(self, base: torch.nn.Embedding, token_id: int, init: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.token_id = token_id
        self.vector = torch.nn.Parameter(init.detach().clone().float())
        self.register_buffer("norm", init.detach().float().norm())

    def direction(self) -> torch.Tensor:
        return self.vector * (self.norm / self.vector.norm())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.base(input_ids)
        mask = (input_ids == self.token_id).unsqueeze(-1)
        return torch.where(mask, self.direction().to(out.dtype), out)


def initializer(tokenizer, text_encoder, class_name: str) -> torch.Tensor:
    """Mean of the class name's sub-word embeddings (no BOS/EOS)."""
    ids = tokenizer(class_name, add_special_tokens=False).input_ids
    if not ids:
        raise BenchError(f"class name {class_name!r} tokenizes to nothing; give a non-empty name")
    return text_encoder.get_input_embeddings().weight[ids].detach().float().mean(0)


def _image_tensor(img, cfg: TIConfig, rng: np.random.Generator) -> torch.Tensor:
    from PIL import Image

    img = img.convert("RGB")
    side = min(img.size)
    left, top = (img.width - side) // 2, (img.height - side) // 2
    img = img.crop((left, top, left + side, top + side)).resize((cfg.resolution, cfg.resolution), Image.BICUBIC)
    if rng.random() < cfg.flip_p:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)
    return x[None]


@dataclass
class TIRun:
    """Frozen SD components prepared for token training (placeholder token added once)."""

    unet: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    noise_scheduler: object
    device: torch.device
    placeholder_id: int = field(init=False)

    def __post_init__(self) -> None:
        from diffusers import DDPMScheduler

        self.noise_scheduler = DDPMScheduler.from_config(self.noise_scheduler.config)
        for m in (self.unet, self.vae, self.text_encoder):
            m.requires_grad_(False)
            m.to(self.device)
        if PLACEHOLDER not in self.tokenizer.get_vocab():
            self.tokenizer.add_tokens([PLACEHOLDER])
            self.text_encoder.resize_token_embeddings(len(self.tokenizer))
        self.placeholder_id = self.tokenizer.convert_tokens_to_ids(PLACEHOLDER)

    def loss(self, split: SplitEmbedding, x: torch.Tensor, template: str, t: torch.Tensor,
             noise_seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            latents = self.vae.encode(x.to(self.device)).latent_dist.sample(generator=g)
            latents = latents * self.vae.config.scaling_factor
        noise = torch.randn(latents.shape, generator=g).to(self.device)
        noisy = self.noise_scheduler.add_noise(latents, noise, t)
        ids = self.tokenizer(template.format(PLACEHOLDER), padding="max_length", truncation=True,
                             max_length=self.tokenizer.model_max_length, return_tensors="pt").input_ids.to(self.device)
        hidden = self.text_encoder(ids)[0]
        pred = self.unet(noisy, t, hidden).sample
        if self.noise_scheduler.config.prediction_type == "v_prediction":
            target = self.noise_scheduler.get_velocity(latents, noise, t)
        else:
            target = noise
        return F.mse_loss(pred.float(), target.float())


def train_class_token(run: TIRun, images: Sequence, class_name: str, cfg: TIConfig = TIConfig(), *,
                      on_step: Callable[[int, float], None] | None = None) -> tuple[torch.Tensor, list[float]]:
    """Learn one token for ``images``; returns the vector (at the initializer's norm) and the losses."""
    if not images:
        raise BenchError(f"class {class_name!r} has no training images; add images or drop the class")
    init = initializer(run.tokenizer, run.text_encoder, class_name)
    base = run.text_encoder.get_input_embeddings()
    split = SplitEmbedding(base, run.placeholder_id, init).to(run.device)
    run.text_encoder.set_input_embeddings(split)
    opt = torch.optim.AdamW([split.vector], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, eps=cfg.eps)
    rng = np.random.default_rng(cfg.seed)
    losses = []
    try:
        for step in range(cfg.steps):
            x = _image_tensor(images[int(rng.integers(len(images)))], cfg, rng)
            t = torch.tensor([int(rng.integers(run.noise_scheduler.config.num_train_timesteps))], device=run.device)
            loss = run.loss(split, x, cfg.templates[int(rng.integers(len(cfg.templates)))], t,
                            int(rng.integers(2**31)))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
            if on_step:
                on_step(step, losses[-1])
        vector = split.direction().detach().cpu()
    finally:
        run.text_encoder.set_input_embeddings(base)
    return vector, losses


def class_images(folder: Path) -> list:
    from PIL import Image

    files = sorted(p for p in folder.iterdir() if p.suffix in IMAGE_SUFFIXES) if folder.is_dir() else []
    return [Image.open(p) for p in files]


def train_tokens(data_dir: str | Path, work_dir: str | Path, run: TIRun, cfg: TIConfig = TIConfig(), *,
                 classes: Sequence[int] | None = None, progress: bool = True) -> dict[int, torch.Tensor]:
    """Tokens for every class folder (``<wnid>/``) of ``data_dir``; resumable per class."""
    from tqdm.auto import tqdm

    data_dir, work_dir = Path(data_dir), Path(work_dir)
    if not data_dir.is_dir():
        raise BenchError(f"--train-tokens {str(data_dir)!r} is not a folder of <wnid>/ image folders")
    wanted = sorted(classes) if classes is not None else sorted(
        imagenet.index_of(p.name) for p in data_dir.iterdir() if p.is_dir() and p.name.startswith("n"))
    if not wanted:
        raise BenchError(f"{data_dir} has no <wnid>/ class folders to train tokens on")
    work_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for idx in tqdm(wanted, desc="textual inversion", unit="class", disable=not progress):
        ckpt = work_dir / f"{idx}.pt"
        if ckpt.is_file():
            out[idx] = torch.load(ckpt, map_location="cpu", weights_only=True)
            continue
        images = class_images(data_dir / imagenet.wnids()[idx])
        vec, losses = train_class_token(run, images, imagenet.get_class(idx).name, cfg)
        with atomic_path(ckpt) as tmp:
            torch.save(vec, tmp)
        log.info("class %d: loss %.4f -> %.4f", idx, np.mean(losses[:10]), np.mean(losses[-10:]))
        out[idx] = vec
    return out
