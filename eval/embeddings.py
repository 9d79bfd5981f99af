"""CLIP embeddings (open_clip; default OpenAI ViT-B/32) of suite images and of captions, for failure directions.
Image embeddings are cached as ``.npz`` (ids + unnormalised float32) per suite manifest, config, CLIP model,
image view and precision (the views and precisions: ``docs/reproducing.md``, "Failure directions").
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import functional as F
from tqdm.auto import tqdm

from genshift.errors import BenchError
from genshift.eval.inference import make_transform
from genshift.fsutil import atomic_path, canonical_json, sha256_bytes
from genshift.pixels import to_rgb
from genshift.suite_format import LocalSuite, read_row_group

log = logging.getLogger(__name__)
DEFAULT_CLIP = ("ViT-B-32-quickgelu", "openai")
IMAGE_VIEWS = ("classifier-square", "center-crop")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class ImageView:
    """Which pixels CLIP sees (module docstring); ``data_config`` is the classifier's, for ``classifier-square``."""

    kind: str = "classifier-square"
    data_config: dict | None = None

    def __post_init__(self) -> None:
        if self.kind not in IMAGE_VIEWS:
            raise BenchError(f"unknown CLIP image view {self.kind!r}; use one of {', '.join(IMAGE_VIEWS)}")
        if self.kind == "classifier-square" and not self.data_config:
            raise BenchError("the classifier-square view needs the classifier's data config (the result's data_config)")

    def key(self) -> str:
        if self.kind == "center-crop":
            return self.kind
        return f"{self.kind}-{sha256_bytes(canonical_json(self.data_config))[:12]}"


@dataclass
class ClipEncoder:
    """An open_clip model (any weights) with its tokenizer; ``model_id`` keys the cache."""

    model: torch.nn.Module
    tokenizer: object
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    model_id: str
    device: str = "cpu"
    precision: str = "auto"

    @classmethod
    def from_pretrained(cls, name: str = DEFAULT_CLIP[0], pretrained: str = DEFAULT_CLIP[1], *,
                        device: str = "cpu", precision: str = "auto") -> ClipEncoder:
        import open_clip

        try:
            model = open_clip.create_model(name, pretrained=pretrained, device=device)
        except RuntimeError as e:
            raise BenchError(f"cannot load CLIP {name}/{pretrained} ({e}); the weights must be cached or the Hub "
                             "reachable") from None
        size = model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        mean = getattr(model.visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN
        std = getattr(model.visual, "image_std", None) or open_clip.OPENAI_DATASET_STD
        return cls(model.eval(), open_clip.get_tokenizer(name), int(size), tuple(mean), tuple(std),
                   f"open_clip:{name}/{pretrained}", device, precision)

    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype of ``precision`` on this device (None: fp32)."""
        if self.precision not in PRECISIONS:
            raise BenchError(f"unknown CLIP precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.precision == "auto":
            return torch.float16 if torch.device(self.device).type == "cuda" else None
        return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]

    def resolved_precision(self) -> str:
        return {None: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.autocast_dtype()]

    def _image_tensor(self, data: bytes, view: ImageView) -> torch.Tensor:
        with Image.open(io.BytesIO(data)) as im:
            im = to_rgb(im)
            if view.kind == "center-crop":
                side = min(im.size)
                im = F.center_crop(im, [side, side]).resize((self.image_size, self.image_size), Image.BICUBIC)
                return F.normalize(F.to_tensor(im), self.mean, self.std)
            x = make_transform(view.data_config, uint8=False)(im)  # what the classifier was given
        mean = torch.tensor(view.data_config["mean"]).view(3, 1, 1)
        std = torch.tensor(view.data_config["std"]).view(3, 1, 1)
        x = (x * std + mean).clamp(0, 1)
        x = F.resize(x, [self.image_size, self.image_size], antialias=True)
        return F.normalize(x, self.mean, self.std)

    @torch.inference_mode()
    def encode_images(self, images: list[bytes], view: ImageView) -> np.ndarray:
        x = torch.stack([self._image_tensor(b, view) for b in images]).to(self.device)
        dtype = self.autocast_dtype()
        with torch.autocast(torch.device(self.device).type, dtype=dtype, enabled=dtype is not None):
            return self.model.encode_image(x).float().cpu().numpy()

    @torch.inference_mode()
    def encode_texts(self, texts: list[str]) -> np.ndarray:
        dtype = self.autocast_dtype()
        with torch.autocast(torch.device(self.device).type, dtype=dtype, enabled=dtype is not None):
            return self.model.encode_text(self.tokenizer(list(texts)).to(self.device)).float().cpu().numpy()


def suite_image_embeddings(suite: LocalSuite, config: str, encoder: ClipEncoder, *, cache_dir: str | Path,
                           view: ImageView, batch_size: int = 64) -> tuple[list[str], np.ndarray]:
    """Image ids and embeddings of a config (computed once per view and precision, then read from the cache)."""
    safe = encoder.model_id.replace("/", "_").replace(":", "_")
    name = f"{config}__{safe}__{view.key()}__{encoder.resolved_precision()}.npz"
    path = Path(cache_dir) / suite.manifest.sha256 / name
    if path.is_file():
        with np.load(path, allow_pickle=False) as f:
            return f["ids"].tolist(), f["emb"]
    suite.verify([config])
    ids, chunks = [], []
    for g in tqdm(suite.row_groups(config), desc=f"CLIP {config}", unit="group", leave=False):
        t = read_row_group(suite.root, g, columns=["image_id", "image"])
        data = t["image"].combine_chunks().field("bytes").to_pylist()
        chunks += [encoder.encode_images(data[a:a + batch_size], view) for a in range(0, len(data), batch_size)]
        ids += t["image_id"].to_pylist()
    emb = np.concatenate(chunks).astype(np.float32)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, ids=np.asarray(ids), emb=emb)
    return ids, emb
