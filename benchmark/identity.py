"""One identity per model: the canonical id of what was loaded, and the digest of its tensors; every part that names,
matches or ranks a model calls this module. The rules: ``docs/results.md``, "Model identity" (Hub weights ``ORG/NAME``,
anything else ``<arch>@sha256:<16 hex of the tensors' digest>``; :func:`folder_name` is one-to-one)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from genshift.errors import BenchError

MAX_ID_CHARS = 96
DIGEST_CHARS = 16  # hex digits of the tensors' sha256 in a local id (64 bits: no accidental collision)
SOURCES = ("hf-hub", "checkpoint", "module", "random")
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
HUB_ID = re.compile(rf"{_PART}/{_PART}")
LOCAL_ID = re.compile(rf"(?P<name>{_PART})@sha256:(?P<digest>[0-9a-f]{{{DIGEST_CHARS}}})")
NAME = re.compile(_PART)
_TIMM_PREFIX = re.compile(r"^(hf-hub:|hf_hub:)?(timm/)?")


def tensors_sha256(state_dict: Mapping) -> str:
    """The sha256 of a state dict's content: every tensor's name, dtype, shape and bytes, in name order;
    independent of the file format, the tensors' devices and memory layout.

    >>> import torch
    >>> a = {"w": torch.arange(6.).reshape(2, 3), "b": torch.zeros(2)}
    >>> b = {"b": torch.zeros(2), "w": torch.arange(6.).reshape(3, 2).t().contiguous().t().reshape(2, 3)}
    >>> tensors_sha256(a) == tensors_sha256(b)
    True
    >>> tensors_sha256(a) == tensors_sha256({**a, "b": torch.ones(2)})
    False
    """
    import torch

    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(t).__name__}, not a tensor")
        if t.device.type == "meta":
            raise ValueError(f"state dict entry {name!r} is on the meta device: it has no values to identify")
        t = t.detach().to("cpu").contiguous()
        h.update(f"{len(name)}:{name}|{t.dtype}|{tuple(t.shape)}|{t.numel() * t.element_size()}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def canonical_id(*, source: str, name: str, repo_id: str | None = None, tensors_sha256: str | None = None) -> str:
    """The canonical id of loaded weights from ``source`` (:data:`SOURCES`), ``name`` (the timm architecture or a
    module's ``model_id``) and ``repo_id`` (the Hub repo they were loaded from).

    >>> canonical_id(source="hf-hub", name="resnet50", repo_id="timm/resnet50.a1_in1k")
    'timm/resnet50.a1_in1k'
    >>> canonical_id(source="checkpoint", name="resnet50", tensors_sha256="0123456789abcdef" * 4)
    'resnet50@sha256:0123456789abcdef'
    """
    if source not in SOURCES:
        raise ValueError(f"unknown weights source {source!r}; one of {', '.join(SOURCES)}")
    if source == "hf-hub":
        if not repo_id:
            raise ValueError("Hub weights need the repo id they were loaded from")
        return check_id(repo_id)
    if not tensors_sha256 or not re.fullmatch(r"[0-9a-f]{64}", tensors_sha256):
        raise ValueError(f"{source} weights need the 64-hex sha256 of their tensors, got {tensors_sha256!r}")
    if not NAME.fullmatch(name or "") or "--" in name or ".." in name:
        raise BenchError(f"model name {name!r} cannot be part of an id: use letters, digits, '.', '_' and '-' "
                         "(ASCII, no spaces)")
    return check_id(f"{name}@sha256:{tensors_sha256[:DIGEST_CHARS]}")


def check_id(model_id: str) -> str:
    """``model_id`` if it has a canonical id's syntax, else ``BenchError`` saying why (and what it likely meant)."""
    if not isinstance(model_id, str):
        raise BenchError(f"a model id is text, got {type(model_id).__name__}")
    shown = ascii(model_id)[1:-1] if len(model_id) <= 120 else ascii(model_id[:120])[1:-1] + "..."
    if len(model_id) > MAX_ID_CHARS:
        raise BenchError(f"model id '{shown}' has {len(model_id)} characters; at most {MAX_ID_CHARS}")
    if not (HUB_ID.fullmatch(model_id) or LOCAL_ID.fullmatch(model_id)) or "--" in model_id or ".." in model_id:
        hint = suggest(model_id)
        raise BenchError(f"model id '{shown}' is not a canonical id (ORG/NAME of a Hub repo, or "
                         f"NAME@sha256:<{DIGEST_CHARS} hex> for local weights; ASCII letters, digits, '.', '_', '-')"
                         + (f"; did you mean '{hint}'?" if hint and hint != model_id else ""))
    return model_id


def suggest(text: str) -> str | None:
    """The id a malformed one was probably meant to be (prefix, revision, spaces, a ``timm/`` repo's case), or None."""
    body = _TIMM_PREFIX.sub(lambda m: "timm/" if m.group(2) else "", text.strip())
    body = body.split("@", 1)[0] if "@sha256:" not in body else body
    if body.lower().startswith("timm/"):
        body = "timm/" + body[5:]
    return body if body.isascii() and (HUB_ID.fullmatch(body) or LOCAL_ID.fullmatch(body)) else None


@dataclass(frozen=True)
class Identity:
    """What a result's ``model`` record says about which weights were scored."""

    id: str                      # the canonical id
    source: str                  # one of SOURCES
    repo_id: str | None          # Hub weights: the repo
    revision: str | None         # Hub weights: the commit sha
    tensors_sha256: str | None   # the tensors' digest (None in results made before it was recorded)

    @property
    def local(self) -> bool:
        """Weights that did not come from the Hub: never shown under, linked to or replacing a Hub entry."""
        return self.source != "hf-hub"

    @property
    def key(self) -> str:
        """Equal for the same weights whatever their id: the tensors' digest (else the id)."""
        return f"sha256:{self.tensors_sha256}" if self.tensors_sha256 else f"id:{self.id}"


def canonical_of(model: Mapping) -> str:
    """The canonical id a result's ``model`` record's loading facts give."""
    source = model.get("source")
    repo = (model.get("pretrained_cfg") or {}).get("hf_hub_id") if model.get("repo_id") is None else model["repo_id"]
    name = model.get("architecture") or ""
    if source == "module" and not name:
        name = model.get("declared_name") or ""
    return canonical_id(source=source, name=name, repo_id=(repo or "").split("@")[0] or None,
                        tensors_sha256=model.get("tensors_sha256"))


def identity_of(model: Mapping, *, strict: bool = True) -> Identity:
    """The :class:`Identity` of a result's ``model`` record. ``strict``: the recorded id must be the
    canonical one its loading facts give (:func:`canonical_of`), else ``BenchError`` naming it."""
    recorded = model.get("id")
    if strict:
        check_id(recorded)
        try:
            want = canonical_of(model)
        except ValueError as e:  # a record that lacks what identifies its weights
            raise BenchError(f"model '{recorded}' cannot be identified from its record: {e}") from None
        if recorded != want:
            raise BenchError(f"model id '{ascii(recorded)[1:-1]}' is not the canonical id of the weights it records; "
                             f"their canonical id is '{want}'")
    source = model.get("source")
    hub = source == "hf-hub"
    return Identity(id=recorded, source=source, repo_id=recorded if hub else None,
                    revision=model.get("weights_revision") if hub else None, tensors_sha256=model.get("tensors_sha256"))


def folder_name(model_id: str) -> str:
    """The folder of a model's entry: one-to-one with canonical ids (``/`` -> ``--`` and ``:`` -> ``-``,
    neither of which a canonical id can otherwise hold), at most ``MAX_ID_CHARS + 1`` characters.

    >>> folder_name("timm/resnet50.a1_in1k"), folder_name("resnet50@sha256:0123456789abcdef")
    ('timm--resnet50.a1_in1k', 'resnet50@sha256-0123456789abcdef')
    """
    return check_id(model_id).replace("/", "--").replace(":", "-")


def timm_name(model_id: str) -> str:
    """The bare timm name of a model id, as timm's results CSVs and the papers' populations name models (a non-timm
    Hub repo keeps its ``org/name``).

    >>> timm_name("hf-hub:timm/resnet50.a1_in1k@0123abc"), timm_name("timm/resnet50.a1_in1k")
    ('resnet50.a1_in1k', 'resnet50.a1_in1k')
    >>> timm_name("hf-hub:someone/net@main")
    'someone/net'
    """
    return _TIMM_PREFIX.sub("", model_id.strip()).split("@", 1)[0]
