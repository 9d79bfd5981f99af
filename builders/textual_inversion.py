"""Textual inversion: learn one token per class (a "dataset interface" for any image collection), and the class
tokens' files.

Dataset Interfaces' settings (Vendrow et al. 2023; :class:`TIConfig`; ``docs/builders.md``): per step a
random one of the 27 "object" templates, a VAE sample, t uniform over a DDPM scheduler made from the
model's, MSE against the velocity (v-prediction, SD 2) or the noise. The token starts at the mean of the
class name's sub-word embeddings and only its direction is learned (:class:`SplitEmbedding`).
Token files are in the layout of the release (``madrylab/imagenet-star-tokens``): ``tokens/<class index>.bin``,
one ``torch.save``d float (1024,) tensor per class.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import random
import re
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from genshift import imagenet
from genshift.builders.seeding import derive_seed
from genshift.errors import BenchError, IntegrityError, first_line
from genshift.fsutil import atomic_path, atomic_write_bytes, atomic_write_json, canonical_json, sha256_file
from genshift.suites import get_suite

log = logging.getLogger(__name__)
MEMBER_RE = re.compile(r"^(?:.*/)?(\d+)\.bin$")
TOKENS_REPO = "madrylab/imagenet-star-tokens"
TOKENS_FILE = "tokens.zip"
# LFS sha256 of the released tokens.zip (uploaded 2023-02-16 with Vendrow et al.'s release).
TOKENS_SHA256 = "c54f0a89cd838cad4067c8b0a365c813f1a0db199dabbcfd5c31506ac99c427d"
_ZIP_DATE = (2023, 2, 16, 0, 0, 0)  # fixed member timestamps: the same tokens give the same zip bytes


def token_name(index: int) -> str:
    """``<tench-0>``, ``<Golden Retriever-207>``: the authors' token strings."""
    return f"<{imagenet.get_class(index).name}-{index}>"


def _check_vector(t, *, where: str, dim: int | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise IntegrityError(f"{where}: expected a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float16, torch.float32, torch.bfloat16):
        raise IntegrityError(f"{where}: dtype {t.dtype} is not a float tensor (expected float32 or float16)")
    if t.ndim == 2 and t.shape[0] == 1:
        t = t[0]
    if t.ndim != 1 or (dim is not None and t.shape[0] != dim):
        raise IntegrityError(f"{where}: shape {tuple(t.shape)} is not ({dim if dim else 'D'},) or (1, {dim or 'D'}); "
                             "tokens must match the text encoder's width (1024 for Stable Diffusion 2)")
    if not torch.isfinite(t).all():
        raise IntegrityError(f"{where}: holds NaN or infinite values")
    return t.detach().float().cpu().clone().contiguous()


def _members(path: Path) -> Iterator[tuple[int, str, bytes]]:
    """(class index, where, bytes) of every ``<idx>.bin`` in a zip or a token folder."""
    if path.is_dir():
        files = sorted(path.glob("tokens/*.bin")) or sorted(path.glob("*.bin"))
        for f in files:
            m = MEMBER_RE.match(f.name)
            if m:
                yield int(m.group(1)), str(f), f.read_bytes()
        return
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise IntegrityError(f"{path.name} is not a zip file of tokens/<class>.bin") from None
    with zf:
        for info in zf.infolist():
            m = MEMBER_RE.match(info.filename)
            if m and not info.is_dir() and "__MACOSX" not in info.filename:
                yield int(m.group(1)), f"{path.name}:{info.filename}", zf.read(info)


def load_token_zip(path: str | Path, *, dim: int | None = 1024, classes: list[int] | None = None
                   ) -> dict[int, torch.Tensor]:
    """Class index -> float32 vector from a tokens.zip or token folder: ``classes``, or all 1000 (each present)."""
    path = Path(path)
    if not path.exists():
        raise BenchError(f"token file {str(path)!r} does not exist; download tokens.zip from {TOKENS_REPO} "
                         "(or pass --tokens hub), or train tokens with --train-tokens")
    wanted = set(range(imagenet.NUM_CLASSES)) if classes is None else {int(c) for c in classes}
    out: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    for idx, where, data in _members(path):
        if not 0 <= idx < imagenet.NUM_CLASSES:
            raise IntegrityError(f"{where}: class index {idx} is outside 0..999")
        if idx in seen:
            raise IntegrityError(f"{where}: a second token file for class {idx}; keep one")
        seen.add(idx)
        if idx not in wanted:
            continue
        try:
            t = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - anything unreadable is the file's fault
            raise IntegrityError(f"{where}: not a saved tensor ({type(e).__name__}: {first_line(e)})") from None
        out[idx] = _check_vector(t, where=where, dim=dim)
    missing = sorted(wanted - set(out))
    if missing:
        raise IntegrityError(f"{path.name} has no token for {len(missing)} class(es), e.g. {missing[:5]}")
    return out


def save_token_file(vector: torch.Tensor, path: str | Path) -> None:
    """One class token as its own ``torch.save`` file, written atomically (float32, shape (D,))."""
    buf = io.BytesIO()
    torch.save(_check_vector(vector, where=str(path), dim=None), buf)
    atomic_write_bytes(path, buf.getvalue())


def save_token_zip(tokens: Mapping[int, torch.Tensor], path: str | Path) -> None:
    """Write tokens in the release layout (``tokens/<idx>.bin``, float32), atomically and reproducibly."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w") as zf:
        for idx in sorted(tokens):
            buf = io.BytesIO()
            torch.save(_check_vector(tokens[idx], where=f"token of class {idx}", dim=None), buf)
            zf.writestr(zipfile.ZipInfo(f"tokens/{int(idx)}.bin", date_time=_ZIP_DATE), buf.getvalue(),
                        compress_type=zipfile.ZIP_DEFLATED)


def inject_tokens(tokenizer, text_encoder, tokens: Mapping[int, torch.Tensor]) -> dict[int, int]:
    """Add one token per class (one ``add_tokens`` call) and copy the vectors in; class -> token id."""
    import inspect

    from transformers import AddedToken

    order = sorted(tokens)
    names = [token_name(i) for i in order]
    vocab = tokenizer.get_vocab()  # once: it is rebuilt on every call (~0.1 s for CLIP)
    clash = [n for n in names if n in vocab]
    if clash:
        raise BenchError(f"token {clash[0]!r} is already in the tokenizer; inject tokens once per tokenizer")
    emb = text_encoder.get_input_embeddings()
    dim = emb.weight.shape[1]
    for i in order:
        _check_vector(tokens[i], where=f"token of class {i}", dim=dim)
    first = len(tokenizer)
    # normalized=False: matched on the raw prompt, before CLIP's normaliser lower-cases it, so the
    # token keeps its capitals and spaces ("<Golden Retriever-207>") with any CLIPTokenizer backend.
    added = tokenizer.add_tokens([AddedToken(n, normalized=False, lstrip=False, rstrip=False, single_word=False)
                                  for n in names])
    if added != len(names):
        raise BenchError(f"the tokenizer added {added} of {len(names)} class tokens")
    # mean_resizing draws the new rows from a fitted Gaussian (slow for 50k x 1024, and it uses the
    # global RNG); every new row is overwritten below anyway.
    kw = {"mean_resizing": False} if "mean_resizing" in inspect.signature(
        text_encoder.resize_token_embeddings).parameters else {}
    text_encoder.resize_token_embeddings(len(tokenizer), **kw)
    ids = {i: tokenizer.convert_tokens_to_ids(n) for i, n in zip(order, names)}
    if list(ids.values()) != list(range(first, first + len(order))):
        raise BenchError("class tokens did not get consecutive ids; use a fresh CLIP tokenizer")
    weight = text_encoder.get_input_embeddings().weight
    with torch.no_grad():
        weight[first:first + len(order)] = torch.stack([tokens[i] for i in order]).to(weight.device, weight.dtype)
    return ids


def tokens_digest(path: str | Path) -> str:
    """sha256 of a token zip, or of a token folder's (index, file hash) list."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for idx, _, data in sorted(_members(path)):
        h.update(f"{idx}:{hashlib.sha256(data).hexdigest()}\n".encode())
    return h.hexdigest()


def download_released_tokens() -> Path:
    """``tokens.zip`` from the Hub (or the HF cache), checked against the released sha256."""
    from huggingface_hub import hf_hub_download

    revision = get_suite("imagenet-star").extra["tokens"]["revision"]  # the release's commit, not a moving main
    try:
        path = Path(hf_hub_download(TOKENS_REPO, TOKENS_FILE, repo_type="dataset", revision=revision))
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: all mean "get the file yourself"
        raise BenchError(f"could not get {TOKENS_FILE} from the Hub dataset {TOKENS_REPO} ({type(e).__name__}); "
                         "download it and pass --tokens PATH, or build with --tokens none") from None
    digest = sha256_file(path)
    if digest != TOKENS_SHA256:
        raise IntegrityError(f"{TOKENS_REPO}/{TOKENS_FILE} has sha256 {digest}, not the released {TOKENS_SHA256}; "
                             "inspect the file and pass it explicitly with --tokens PATH if it is intended")
    return path


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
        """From ``genshift.builders.real_models.tiny_sd_components()``-style dicts or a pipeline's ``components``."""
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
