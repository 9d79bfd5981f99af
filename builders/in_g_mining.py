"""Failure mining for IN-G (Wiles et al. s4.2; ``docs/builders.md``): per seed caption, images (seeds from the
caption id) until ``cap`` fail by the paper's definition (none of the top-3 under the true class's WordNet parent:
``genshift.eval.metrics.parent_failures``) or ``n_max`` were sampled; each caption's outcome is checkpointed."""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from genshift.builders.common import load_parquet, save_parquet
from genshift.builders.seeding import derive_seed
from genshift.errors import BenchError
from genshift.eval.metrics import parent_failures

Generate = Callable[[list[str], list[int]], list[bytes]]
Classify = Callable[[list[bytes]], np.ndarray]  # (n, 1000) probabilities


@dataclass(frozen=True)
class MiningConfig:
    n_max: int = 1000   # images sampled per caption at most (the paper's "up to a thousand")
    cap: int = 2        # failures kept per caption (the paper's cap is unknown; recorded)
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise BenchError(f"cap must be at least 1 (failures kept per caption), got {self.cap}")
        if self.n_max < self.cap:
            raise BenchError(f"n_max ({self.n_max}) is smaller than cap ({self.cap}); a caption could never fill "
                             "its cap")


def caption_id(label: int, caption: str, occurrence: int = 0) -> str:
    """The id of a caption; a caption seen again (another image gave the same text) gets its own id,
    hence its own seeds: each seed caption is mined, as the paper mines every image's caption."""
    text = caption if occurrence == 0 else f"{caption}#{occurrence}"
    return f"{label:03d}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


@dataclass
class Attempt:
    index: int
    seed: int
    image: bytes = field(repr=False)
    top5_idx: list[int]
    top5_prob: list[float]
    top1_miss: bool
    top3_miss: bool
    parent_failure: bool


@dataclass
class CaptionResult:
    caption_id: str
    label: int
    caption: str
    sampled: int
    kept: list[Attempt]

    def save(self, path: Path) -> None:
        import pyarrow as pa

        schema = pa.schema([("index", pa.int32()), ("seed", pa.int64()), ("image", pa.binary()),
                            ("top5_idx", pa.list_(pa.int16())), ("top5_prob", pa.list_(pa.float32())),
                            ("top1_miss", pa.bool_()), ("top3_miss", pa.bool_()), ("parent_failure", pa.bool_())])
        table = pa.Table.from_pylist([asdict(a) for a in self.kept], schema=schema)
        save_parquet(path, table, {"caption": {"caption_id": self.caption_id, "label": self.label,
                                               "caption": self.caption, "sampled": self.sampled}})

    @classmethod
    def load(cls, path: Path) -> CaptionResult:
        rows, meta = load_parquet(path)
        c = meta["caption"]
        return cls(c["caption_id"], c["label"], c["caption"], c["sampled"], [Attempt(**r) for r in rows])


def mine_caption(label: int, caption: str, *, generate: Generate, classify: Classify, cfg: MiningConfig,
                 cid: str | None = None) -> CaptionResult:
    """Sample until ``cfg.cap`` failures are kept or ``cfg.n_max`` images were sampled."""
    cid = cid or caption_id(label, caption)
    kept: list[Attempt] = []
    sampled = 0
    while sampled < cfg.n_max and len(kept) < cfg.cap:
        n = min(cfg.batch_size, cfg.n_max - sampled)
        seeds = [derive_seed(cfg.seed, cid, sampled + j) for j in range(n)]
        images = generate([caption] * n, seeds)
        probs = np.asarray(classify(images), dtype=np.float64)
        top5 = np.argsort(-probs, axis=1, kind="stable")[:, :5]
        fail = parent_failures(np.full(n, label), top5[:, :3])
        for j in np.flatnonzero(fail)[:cfg.cap - len(kept)].tolist():
            kept.append(Attempt(index=sampled + j, seed=seeds[j], image=images[j],
                                top5_idx=top5[j].tolist(), top5_prob=probs[j, top5[j]].astype(np.float32).tolist(),
                                top1_miss=bool(top5[j, 0] != label), top3_miss=bool(label not in top5[j, :3]),
                                parent_failure=True))
        sampled += n
    return CaptionResult(cid, label, caption, sampled, kept)


def mine_all(captions: Sequence[tuple[int, str]], work_dir: Path, *, generate: Generate, classify: Classify,
             cfg: MiningConfig, owns: Callable[[str], bool] = lambda cid: True, progress: bool = True
             ) -> dict[str, CaptionResult]:
    """Mine every caption this process owns, resuming from checkpoints in ``work_dir``."""
    from tqdm.auto import tqdm

    work_dir.mkdir(parents=True, exist_ok=True)
    out, todo = {}, []
    seen: Counter = Counter()
    for label, caption in captions:
        cid = caption_id(label, caption, seen[label, caption])
        seen[label, caption] += 1
        if not owns(cid):
            continue
        ckpt = work_dir / f"{cid}.parquet"
        if ckpt.is_file():
            out[cid] = CaptionResult.load(ckpt)
        else:
            todo.append((label, caption, ckpt, cid))
    bar = tqdm(todo, desc="mine", unit="caption", disable=not progress, dynamic_ncols=True)
    for label, caption, ckpt, cid in bar:
        res = mine_caption(label, caption, generate=generate, classify=classify, cfg=cfg, cid=cid)
        res.save(ckpt)
        out[res.caption_id] = res
        bar.set_postfix(kept=sum(len(r.kept) for r in out.values()))
    return out


def classifier_from_timm(model_name: str, *, device: str = "cpu", checkpoint: str | None = None,
                         pretrained: bool = True, batch_size: int = 64) -> tuple[Classify, dict]:
    """A ``classify`` function over JPEG bytes with the target's own timm eval transform."""
    import torch
    from PIL import Image

    from genshift.eval.models import load_classifier

    clf = load_classifier(model_name, checkpoint=checkpoint, device=device, pretrained=pretrained)

    @torch.inference_mode()
    def classify(images: list[bytes]) -> np.ndarray:
        outs = []
        for a in range(0, len(images), batch_size):
            x = torch.stack([clf.transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in images[a:a + batch_size]])
            outs.append(clf.model(x.to(device)).float().softmax(-1).cpu().numpy())
        return np.concatenate(outs)

    return classify, clf.describe()
