"""Textual inversion: learn one token per class (a "dataset interface" for any image collection).

Dataset Interfaces' settings (Vendrow et al. 2023; :class:`TIConfig`; ``docs/builders.md``): per step a
random one of the 27 "object" templates, a VAE sample, t uniform over a DDPM scheduler made from the
model's, MSE against the velocity (v-prediction, SD 2) or the noise. The token starts at the mean of the
class name's sub-word embeddings and only its direction is learned (:class:`SplitEmbedding`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from genshift import imagenet
from genshift.builders.seeding import derive_seed
from genshift.builders.tokens import load_token_zip, save_token_file
from genshift.errors import BenchError
from genshift.fsutil import atomic_write_json, canonical_json

log = logging.getLogger(__name__)
TEMPLATES = (
    "a photo of a {}", "a rendering of a {}", "a cropped photo of the {}", "the photo of a {}",
    "a photo of a clean {}", "a photo of a dirty {}", "a dark photo of the {}", "a photo of my {}",
    "a photo of the cool {}", "a close-up photo of a {}", "a bright photo of the {}", "a cropped photo of a {}",
    "a photo of the {}", "a good photo of the {}", "a photo of one {}", "a close-up photo of the {}",
    "a rendition of the {}", "a photo of the clean {}", "a rendition of a {}", "a photo of a nice {}",
    "a good photo of a {}", "a photo of the nice {}", "a photo of the small {}", "a photo of the weird {}",
    "a photo of the large {}", "a photo of a cool {}", "a photo of a small {}",
)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
SETTINGS_FILE = "settings.json"


@dataclass(frozen=True)
class TIConfig:
    steps: int = 3000
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 1e-2
    eps: float = 1e-8
    batch_size: int = 1
    resolution: int = 768
    center_crop: bool = True
    flip_p: float = 0.5
    templates: tuple[str, ...] = TEMPLATES
    hold_norm: bool = True
    seed: int = 0


@dataclass(frozen=True)
class TrainingClass:
    """One class of a dataset interface: index, natural-language name (initialiser), image files."""

    index: int
    name: str
    files: tuple[Path, ...] = field(repr=False)


def folder_classes(root: str | Path, *, classes: Sequence[int] | None = None) -> list[TrainingClass]:
    """The classes of an image folder ``root/<class>/<images>``: class folders are ImageNet-1k wnids
    (``n01440764``) or indices (``0``), names the OpenAI names (``genshift.imagenet``). A selected
    class whose folder holds no image is an error."""
    root = Path(root)
    if not root.is_dir():
        raise BenchError(f"training image folder {str(root)!r} does not exist; pass a folder of class folders")
    found: dict[int, tuple[str, Path]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        idx = int(folder.name) if folder.name.isdigit() else imagenet.index_of(folder.name)
        if idx in found:
            raise BenchError(f"class {idx} has two folders under {str(root)!r} ({found[idx][1].name}, {folder.name})")
        found[idx] = (imagenet.get_class(idx).name, folder)
    wanted = sorted(found) if classes is None else [int(c) for c in classes]
    if not wanted:
        raise BenchError(f"{str(root)!r} has no class folders")
    out = []
    for idx in wanted:
        if idx not in found:
            raise BenchError(f"class {idx} has no folder under {str(root)!r}; add <wnid or index>/ with its images")
        name, folder = found[idx]
        files = tuple(sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES))
        if not files:
            raise BenchError(f"class {idx} ({name!r}) has no training images in {str(folder)!r} "
                             f"(looked for {', '.join(IMAGE_SUFFIXES)}); add images or drop the class")
        out.append(TrainingClass(idx, name, files))
    return out


def preprocess(path: Path, cfg: TIConfig, *, flip: bool) -> torch.Tensor:
    """One training image as ``(3, r, r)`` in [-1, 1]: centre crop, bicubic resize, optional flip."""
    from PIL import Image

    with Image.open(path) as im:
        img = im.convert("RGB")
    if cfg.center_crop:
        side = min(img.size)
        left, top = (img.width - side) // 2, (img.height - side) // 2
        img = img.crop((left, top, left + side, top + side))
    img = img.resize((cfg.resolution, cfg.resolution), Image.BICUBIC)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)


class SplitEmbedding(torch.nn.Module):
    """The frozen token table plus one trainable row served for ``token_id`` (may be one past the table's end); with
    ``hold_norm`` the row is rescaled to the initialiser's norm in every forward pass: only its direction is learned."""

    def __init__(self, base: torch.nn.Embedding, token_id: int, init: torch.Tensor, *, hold_norm: bool = True):
        super().__init__()
        self.base = base
        self.token_id = int(token_id)
        self.vector = torch.nn.Parameter(init.detach().clone().float())
        self.register_buffer("norm", init.detach().float().norm())
        self.hold_norm = hold_norm

    def direction(self) -> torch.Tensor:
        """The served token: the row at the initialiser's norm (or as is without ``hold_norm``)."""
        return self.vector * (self.norm / self.vector.norm()) if self.hold_norm else self.vector

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = input_ids == self.token_id
        out = self.base(input_ids.masked_fill(mask, 0))
        return torch.where(mask.unsqueeze(-1), self.direction().to(out.dtype), out)


def template_ids(tokenizer, template: str, token_id: int) -> list[int]:
    """Ids of ``template`` with the class token at ``{}``: BOS, text, EOS, padding to the model length.

    The same ids as tokenizing the filled template with the token added to the tokenizer (CLIP's
    pre-tokenizer splits at the spaces around it), without adding anything to the tokenizer.
    """
    pre, post = template.split("{}")
    ids = [tokenizer.bos_token_id, *tokenizer(pre.strip(), add_special_tokens=False).input_ids, token_id,
           *tokenizer(post.strip(), add_special_tokens=False).input_ids]
    n = tokenizer.model_max_length
    ids = ids[:n - 1] + [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return ids + [pad] * (n - len(ids))


def initializer(tokenizer, text_encoder, class_name: str) -> torch.Tensor:
    """Mean of the class name's sub-word embeddings (no BOS/EOS), float32; names are ImageNet's, never empty."""
    ids = tokenizer(class_name, add_special_tokens=False).input_ids
    table = text_encoder.get_input_embeddings().weight
    return table[torch.tensor(ids, device=table.device)].detach().float().mean(0)


@dataclass
class TIRun:
    """Frozen SD components prepared for token training (nothing of them is modified)."""

    unet: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    noise_scheduler: object
    device: torch.device
    token_id: int = field(init=False)
    dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        from diffusers import DDPMScheduler

        self.device = torch.device(self.device)
        self.noise_scheduler = DDPMScheduler.from_config(self.noise_scheduler.config)
        if self.noise_scheduler.config.prediction_type not in ("epsilon", "v_prediction"):
            raise BenchError(f"textual inversion supports epsilon and v_prediction models, not "
                             f"{self.noise_scheduler.config.prediction_type!r}")
        for m in (self.unet, self.vae, self.text_encoder):
            m.requires_grad_(False)
            m.to(self.device)
        self.text_encoder.to(torch.float32)
        self.dtype = next(self.unet.parameters()).dtype
        self.token_id = self.text_encoder.get_input_embeddings().num_embeddings

    @classmethod
    def from_components(cls, components: dict, device: str | torch.device = "cpu") -> TIRun:
        """From ``genshift.builders.tiny.tiny_sd_components()``-style dicts or a pipeline's ``components``."""
        return cls(components["unet"], components["vae"], components["text_encoder"], components["tokenizer"],
                   components["scheduler"], device)

    def batch(self, cls: TrainingClass, picks: Sequence[tuple[int, int, bool]], cfg: TIConfig):
        """Pixels and token ids for (file index, template index, flip) picks."""
        pixels = torch.stack([preprocess(cls.files[f], cfg, flip=flip) for f, _, flip in picks])
        ids = torch.tensor([template_ids(self.tokenizer, cfg.templates[t], self.token_id) for _, t, _ in picks])
        return pixels.to(self.device, self.dtype), ids.to(self.device)

    def loss(self, pixels: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The denoising loss of one batch; VAE sample, noise and t drawn from ``gen`` (CPU)."""
        with torch.no_grad():
            dist = self.vae.encode(pixels).latent_dist
            z = torch.randn(dist.mean.shape, generator=gen).to(self.device)
            latents = (dist.mean.float() + dist.std.float() * z) * self.vae.config.scaling_factor
        noise = torch.randn(latents.shape, generator=gen).to(self.device)
        t = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (latents.shape[0],),
                          generator=gen).to(self.device)
        noisy = self.noise_scheduler.add_noise(latents, noise, t)
        amp = self.device.type == "cuda" and self.dtype != torch.float32  # fp32 text encoder under autocast
        with torch.autocast("cuda", dtype=self.dtype) if amp else contextlib.nullcontext():
            hidden = self.text_encoder(ids)[0]
        pred = self.unet(noisy.to(self.dtype), t, hidden.to(self.dtype)).sample
        v_prediction = self.noise_scheduler.config.prediction_type == "v_prediction"
        target = self.noise_scheduler.get_velocity(latents, noise, t) if v_prediction else noise
        return F.mse_loss(pred.float(), target.float())

    @contextlib.contextmanager
    def installed(self, init: torch.Tensor, *, hold_norm: bool = True) -> Iterator[SplitEmbedding]:
        """The text encoder serves ``init`` for :attr:`token_id` inside the block; its own table after."""
        base = self.text_encoder.get_input_embeddings()
        split = SplitEmbedding(base, self.token_id, init.to(self.device), hold_norm=hold_norm).to(self.device)
        self.text_encoder.set_input_embeddings(split)
        try:
            yield split
        finally:
            self.text_encoder.set_input_embeddings(base)


def _picks(n_files: int, cfg: TIConfig, seed: int):
    """Endless (file, template, flip) picks: every pass over the files is a fresh shuffle."""
    rng = random.Random(seed)
    while True:
        order = list(range(n_files))
        rng.shuffle(order)
        for f in order:
            yield f, rng.randrange(len(cfg.templates)), rng.random() < cfg.flip_p


def train_class_token(run: TIRun, cls: TrainingClass, cfg: TIConfig = TIConfig()) -> tuple[torch.Tensor, list[float]]:
    """Learn one class token; returns the served vector (at the initialiser's norm) and the losses."""
    init = initializer(run.tokenizer, run.text_encoder, cls.name)
    seed = derive_seed(cfg.seed, "textual-inversion", cls.index)
    gen, picks = torch.Generator().manual_seed(seed), _picks(len(cls.files), cfg, seed)
    scaler = torch.amp.GradScaler(run.device.type, enabled=run.device.type == "cuda" and run.dtype == torch.float16)
    losses: list[float] = []
    with run.installed(init, hold_norm=cfg.hold_norm) as split:
        opt = torch.optim.AdamW([split.vector], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, eps=cfg.eps)
        for _ in range(cfg.steps):
            pixels, ids = run.batch(cls, [next(picks) for _ in range(cfg.batch_size)], cfg)
            loss = run.loss(pixels, ids, gen)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        return split.direction().detach().float().cpu().clone(), losses


@torch.no_grad()
def eval_loss(run: TIRun, cls: TrainingClass, vector: torch.Tensor, cfg: TIConfig = TIConfig(), *, n: int = 16,
              seed: int = 1234) -> float:
    """Mean loss of ``vector`` (used as given) on ``n`` fixed (image, template, flip, noise, t) draws."""
    gen, picks = torch.Generator().manual_seed(seed), _picks(len(cls.files), cfg, seed)
    with run.installed(vector, hold_norm=False):
        return float(np.mean([float(run.loss(*run.batch(cls, [next(picks)], cfg), gen)) for _ in range(n)]))


def train_tokens(data_dir: str | Path, work_dir: str | Path, run: TIRun, cfg: TIConfig = TIConfig(), *,
                 classes: Sequence[int] | None = None, model_id: str = "",
                 process=None, progress: bool = True) -> dict[int, torch.Tensor]:
    """Tokens for the class folders of ``data_dir``, resumable per class (``work_dir/<idx>.bin``, written last);
    returns the finished ones. With ``process`` classes are split round-robin over processes."""
    from tqdm.auto import tqdm

    todo_classes = folder_classes(data_dir, classes=classes)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    recipe = {"model_id": model_id, "label_space": "imagenet", "textual_inversion": asdict(cfg)}
    path = work_dir / SETTINGS_FILE
    if not path.is_file():
        atomic_write_json(path, recipe)
    elif json.loads(path.read_text()) != json.loads(canonical_json(recipe)):
        raise BenchError(f"{str(work_dir)!r} holds tokens trained with other settings ({path}); use another folder "
                         "or the same settings")
    mine = [c for i, c in enumerate(todo_classes) if process is None or process.owns(i)]
    todo = [c for c in mine if not (work_dir / f"{c.index}.bin").is_file()]
    if len(todo) < len(mine):
        log.info("textual inversion: %d of %d classes already done in %s", len(mine) - len(todo), len(mine), work_dir)
    for cls in tqdm(todo, desc="textual inversion", unit="class", disable=not progress):
        vec, losses = train_class_token(run, cls, cfg)
        k = max(1, min(100, len(losses) // 10))
        atomic_write_json(work_dir / "meta" / f"{cls.index}.json", {
            "index": cls.index, "name": cls.name, "images": len(cls.files), "steps": len(losses),
            "init_norm": float(vec.norm()), "loss_first": float(np.mean(losses[:k])),
            "loss_last": float(np.mean(losses[-k:]))})
        save_token_file(vec, work_dir / f"{cls.index}.bin")  # last: marks the class done
        log.info("class %d (%s): loss %.4f -> %.4f", cls.index, cls.name, np.mean(losses[:k]), np.mean(losses[-k:]))
    done = [c.index for c in todo_classes if (work_dir / f"{c.index}.bin").is_file()]
    return load_token_zip(work_dir, dim=None, classes=done) if done else {}
