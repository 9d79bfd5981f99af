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

        from genshift.builders.real_models import tiny_open_clip

        model, preprocess, _ = tiny_open_clip(seed=seed)
        return cls(model, preprocess, open_clip.tokenize, model_id=f"tiny-open-clip(seed={seed})", device=device)

    def _normalized(self, encode, x: torch.Tensor) -> torch.Tensor:
        """``encode(x)`` under fp16 autocast on CUDA (``autocast_dtype``), L2-normalised float32, ``(n, d)``."""
        on = self.autocast_dtype is not None
        with torch.autocast(self.device.type if on else "cpu", dtype=self.autocast_dtype, enabled=on):
            e = encode(x.to(self.device))
        return torch.nn.functional.normalize(e.float(), dim=-1)

    @torch.inference_mode()
    def encode_images(self, images: Sequence) -> torch.Tensor:
        """Embeddings of PIL images."""
        x = torch.stack([self.preprocess(im.convert("RGB")) for im in images])
        return self._normalized(self.model.encode_image, x)

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Text embeddings (open_clip's own EOS-pooled text path)."""
        return self._normalized(self.model.encode_text, self.tokenizer(list(texts)))


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of two ``(n, d)`` batches of normalised embeddings."""
    return (a * b).sum(-1)
