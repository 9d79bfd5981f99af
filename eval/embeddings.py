"""CLIP embeddings of suite images and of captions, for analyses such as failure directions.

Image embeddings are model-independent, so they are computed once per (suite manifest, config,
CLIP model) and cached as ``.npz`` (image ids + float32 embeddings, unnormalised as the
failure-directions code uses them). Default model: OpenAI CLIP ViT-B/32 through open_clip
(``ViT-B-32-quickgelu``/``openai``). Image path: centre square crop, bicubic resize to the CLIP
input size, CLIP normalisation (the classifier-free analogue of the authors' pipeline).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmark.errors import BenchError
from benchmark.fsutil import atomic_path
from benchmark.pixels import to_rgb
from benchmark.reader import LocalSuite, read_row_group

log = logging.getLogger(__name__)
DEFAULT_CLIP = ("ViT-B-32-quickgelu", "openai")


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

    @classmethod
    def from_pretrained(cls, name: str = DEFAULT_CLIP[0], pretrained: str = DEFAULT_CLIP[1], *,
                        device: str = "cpu") -> "ClipEncoder":
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
                   f"open_clip:{name}/{pretrained}", device)

    def _image_tensor(self, data: bytes) -> torch.Tensor:
        from PIL import Image
        from torchvision.transforms import functional as F

        with Image.open(io.BytesIO(data)) as im:
            im = to_rgb(im)
            side = min(im.size)
            im = F.center_crop(im, [side, side]).resize((self.image_size, self.image_size), Image.BICUBIC)
            return F.normalize(F.to_tensor(im), self.mean, self.std)

    @torch.inference_mode()
    def encode_images(self, images: list[bytes]) -> np.ndarray:
        x = torch.stack([self._image_tensor(b) for b in images]).to(self.device)
        return self.model.encode_image(x).float().cpu().numpy()

    @torch.inference_mode()
    def encode_texts(self, texts: list[str]) -> np.ndarray:
        return self.model.encode_text(self.tokenizer(list(texts)).to(self.device)).float().cpu().numpy()


def suite_image_embeddings(suite: LocalSuite, config: str, encoder: ClipEncoder, *, cache_dir: str | Path,
                           batch_size: int = 64) -> tuple[list[str], np.ndarray]:
    """Image ids and embeddings of a config (computed once, then read from the cache)."""
    from tqdm.auto import tqdm

    safe = encoder.model_id.replace("/", "_").replace(":", "_")
    path = Path(cache_dir) / suite.manifest.sha256 / f"{config}__{safe}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as f:
            return f["ids"].tolist(), f["emb"]
    suite.verify([config])
    ids, chunks = [], []
    groups = suite.row_groups(config)
    for g in tqdm(groups, desc=f"CLIP {config}", unit="group", leave=False):
        t = read_row_group(suite.root, g, columns=["image_id", "image"])
        data = t["image"].combine_chunks().field("bytes").to_pylist()
        for a in range(0, len(data), batch_size):
            chunks.append(encoder.encode_images(data[a:a + batch_size]))
        ids += t["image_id"].to_pylist()
    emb = np.concatenate(chunks).astype(np.float32)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, ids=np.asarray(ids), emb=emb)
    return ids, emb
