"""ImageNet* class tokens: read/write the released ``tokens.zip`` and inject tokens into a text encoder.

The release (``madrylab/imagenet-star-tokens``, ``tokens.zip``) holds ``tokens/<class index>.bin``,
one ``torch.save``d float tensor of shape (1024,) per class (``specs/imagenet_star.md`` s2). Each
is loaded with ``torch.load(weights_only=True)`` (no arbitrary unpickling) and validated. Tokens are
named ``<{class name}-{index}>`` with the OpenAI class names (spaces and capitals kept) and added
to the tokenizer in ONE call, so class c gets id ``len(tokenizer) + rank of c`` (49408 + c for all
1000 classes, as in the authors' build).
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from benchmark import imagenet
from benchmark.errors import BenchError, IntegrityError
from benchmark.fsutil import atomic_path

MEMBER_RE = re.compile(r"^(?:.*/)?(\d+)\.bin$")


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
        raise IntegrityError(f"{where}: shape {tuple(t.shape)} is not ({dim if dim else 'D'},) or (1, {dim or 'D'})")
    if not torch.isfinite(t).all():
        raise IntegrityError(f"{where}: holds NaN or infinite values")
    return t.float()


def load_token_zip(path: str | Path, *, dim: int | None = 1024, classes: list[int] | None = None
                   ) -> dict[int, torch.Tensor]:
    """Class index -> float32 vector from a tokens.zip (only ``classes`` if given)."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"token file {str(path)!r} does not exist; download tokens.zip from "
                         "madrylab/imagenet-star-tokens or train tokens with --train-tokens")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise IntegrityError(f"{path.name} is not a zip file of tokens/<class>.bin") from None
    out: dict[int, torch.Tensor] = {}
    with zf:
        for name in zf.namelist():
            m = MEMBER_RE.match(name)
            if not m:
                continue
            idx = int(m.group(1))
            if not 0 <= idx < imagenet.NUM_CLASSES:
                raise IntegrityError(f"{path.name}:{name}: class index {idx} is outside 0..999")
            if classes is not None and idx not in classes:
                continue
            try:
                t = torch.load(io.BytesIO(zf.read(name)), map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - anything unreadable is the file's fault
                raise IntegrityError(f"{path.name}:{name}: not a saved tensor ({type(e).__name__}: {e})") from None
            out[idx] = _check_vector(t, where=f"{path.name}:{name}", dim=dim)
    wanted = set(range(imagenet.NUM_CLASSES)) if classes is None else set(classes)
    missing = sorted(wanted - set(out))
    if missing:
        raise IntegrityError(f"{path.name} has no token for {len(missing)} class(es), e.g. {missing[:5]}")
    return out


def save_token_zip(tokens: Mapping[int, torch.Tensor], path: str | Path) -> None:
    """Write tokens in the release layout (``tokens/<idx>.bin``, float32), atomically."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for idx in sorted(tokens):
            buf = io.BytesIO()
            torch.save(tokens[idx].detach().float().cpu().clone(), buf)
            zf.writestr(f"tokens/{idx}.bin", buf.getvalue())


def inject_tokens(tokenizer, text_encoder, tokens: Mapping[int, torch.Tensor]) -> dict[int, int]:
    """Add one token per class (one ``add_tokens`` call) and copy the vectors in; class -> token id."""
    order = sorted(tokens)
    names = [token_name(i) for i in order]
    clash = [n for n in names if n in tokenizer.get_vocab()]
    if clash:
        raise BenchError(f"token {clash[0]!r} is already in the tokenizer; inject tokens once per tokenizer")
    emb = text_encoder.get_input_embeddings()
    dim = emb.weight.shape[1]
    for i in order:
        _check_vector(tokens[i], where=f"token of class {i}", dim=dim)
    first = len(tokenizer)
    added = tokenizer.add_tokens(names)
    if added != len(names):
        raise BenchError(f"the tokenizer added {added} of {len(names)} class tokens")
    text_encoder.resize_token_embeddings(len(tokenizer))
    ids = {i: tokenizer.convert_tokens_to_ids(n) for i, n in zip(order, names)}
    if list(ids.values()) != list(range(first, first + len(order))):
        raise BenchError("class tokens did not get consecutive ids; use a fresh (slow) CLIP tokenizer")
    weight = text_encoder.get_input_embeddings().weight
    with torch.no_grad():
        for i in order:
            weight[ids[i]] = tokens[i].to(weight.dtype)
    return ids
