"""ImageNet* class tokens in the layout of the release (``madrylab/imagenet-star-tokens``), which our textual
inversion writes too: ``tokens/<class index>.bin``, one ``torch.save``d float (1024,) tensor per class."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError, first_line
from genshift.fsutil import atomic_path, atomic_write_bytes, sha256_file
from genshift.suites import get_suite

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
