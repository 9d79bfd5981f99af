"""CLIP embeddings with open_clip (the builders' filters and checks): L2-normalised float32, scored by
cosine (no logit scale), as the ImageNet* and LANCE filters define it."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ClipScorer:
    """Image and text embeddings from one open_clip model (``model_id`` is recorded with the scores)."""

    def __init__(self, model, preprocess, tokenizer, *, model_id: str, device: str | torch.device = "cpu",
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.model = model.to(device).eval()
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = torch.device(device)
        self.autocast_dtype = autocast_dtype

    @classmethod
    def from_pretrained(cls, name: str = "ViT-H-14", pretrained: str = "laion2b_s32b_b79k", *,
                        device: str | torch.device = "cpu", cache_dir: str | None = None) -> ClipScorer:
        import open_clip

        from genshift.builders.common import loading

        with loading(f"open_clip {name}/{pretrained}", "check the names (open_clip.list_pretrained()) and that the "
                                                       "weights are cached or the Hub reachable", (RuntimeError,)):
            model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained,
                                                                         cache_dir=cache_dir)
        autocast = torch.float16 if torch.device(device).type == "cuda" else None
        return cls(model, preprocess, open_clip.get_tokenizer(name), model_id=f"open_clip:{name}/{pretrained}",
                   device=device, autocast_dtype=autocast)

    @classmethod
    def tiny(cls, *, seed: int = 0, device: str | torch.device = "cpu") -> ClipScorer:
        import open_clip

        from genshift.builders.tiny import tiny_open_clip

        model, preprocess, _ = tiny_open_clip(seed=seed)
        return cls(model, preprocess, open_clip.tokenize, model_id=f"tiny-open-clip(seed={seed})", device=device)

    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(device_type="cpu", enabled=False)
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @torch.inference_mode()
    def encode_images(self, images: Sequence) -> torch.Tensor:
        """L2-normalised embeddings of PIL images, shape ``(n, d)``."""
        x = torch.stack([self.preprocess(im.convert("RGB")) for im in images]).to(self.device)
        with self._autocast():
            e = self.model.encode_image(x)
        return torch.nn.functional.normalize(e.float(), dim=-1)

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """L2-normalised text embeddings (open_clip's own EOS-pooled text path), ``(n, d)``."""
        tokens = self.tokenizer(list(texts)).to(self.device)
        with self._autocast():
            e = self.model.encode_text(tokens)
        return torch.nn.functional.normalize(e.float(), dim=-1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of two ``(n, d)`` batches of normalised embeddings."""
    return (a * b).sum(-1)
