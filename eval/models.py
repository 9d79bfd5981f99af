"""Load any timm ImageNet-1k classifier with pinned weights and timm's own eval preprocessing.

Accepted names::

    resnet50.a1_in1k                 timm registry name (arch.tag; a bare arch takes its default tag)
    timm/resnet50.a1_in1k            Hub repo id of timm weights
    hf-hub:timm/resnet50.a1_in1k@<sha>  explicit Hub form, optionally pinned to a commit
    <any of these> + --checkpoint FILE   architecture from the name, weights from a local file

The Hub revision is always resolved to a 40-character commit sha before loading (online: the
Hub API; offline: the local cache's refs), the weights are loaded at that sha, and the sha256 of
the weight file is recorded. Preprocessing is ``resolve_data_config({}, model=m,
use_test_size=True)`` + ``create_transform`` (what timm's ``validate.py`` and results tables use;
see ``docs/results.md``).
"""

from __future__ import annotations

import difflib
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from genshift.errors import BenchError, NotFoundError, OfflineError, first_line
from genshift.fsutil import sha256_file
from genshift.hubio import OFFLINE_ROUTE, SHA_RE, _unreachable
from genshift.eval.results import PROTOCOL_OPTIONS

log = logging.getLogger(__name__)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors", "open_clip_pytorch_model.bin")
DATA_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
# The largest timm ImageNet classifiers hold ~1B parameters (eva_giant: 4 GB in fp32); a training
# checkpoint with EMA weights and Adam state is ~4x that. Anything larger is not a checkpoint.
MAX_CHECKPOINT_BYTES = 32 << 30


@dataclass(frozen=True)
class ModelRef:
    """A parsed model name: timm architecture name and/or Hub repo, requested revision."""

    text: str
    name: str | None        # timm registry name (arch or arch.tag); None for a bare hf-hub repo
    repo_id: str | None     # Hub repo holding the weights
    revision: str | None    # requested revision (branch, tag or sha) or None


@dataclass
class LoadedClassifier:
    """A model ready for inference plus everything a result records about it."""

    model: torch.nn.Module
    transform: object
    data_config: dict
    model_id: str                 # canonical id, e.g. "timm/resnet50.a1_in1k"
    architecture: str
    tag: str | None
    source: str                   # "hf-hub" | "checkpoint" | "random"
    weights_revision: str | None  # 40-char Hub sha
    weights_sha256: str | None
    weights_file: str | None
    num_params: int
    pretrained_cfg: dict = field(default_factory=dict)
    checkpoint_weights: str | None = None  # "model" | "ema" when --checkpoint was a training checkpoint

    @classmethod
    def from_module(cls, model: torch.nn.Module, *, model_id: str | None = None, data_config: dict | None = None,
                    transform=None, preprocess: str = "timm") -> LoadedClassifier:
        """A module holding its weights (``genshift.evaluate(model=...)``): a timm model brings its data
        config; any other module takes ``data_config`` (timm's keys, the rest defaulted as timm does) or
        ``transform``, and ``model_id``. Its id: the architecture (or ``model_id``) and its tensors' digest."""
        from timm.data import resolve_data_config

        from genshift.identity import canonical_id, tensors_sha256

        cfg = dict(getattr(model, "pretrained_cfg", None) or {})
        name = cfg.get("architecture") or model_id
        if name is None or (not cfg and data_config is None and transform is None):
            raise BenchError("a module that is not a timm model needs model_id= and data_config= (or transform=)")
        if transform is not None:  # recorded by what it does, as far as its repr says
            data_config = {"transform": repr(transform)}
        elif data_config is not None:
            data_config = _jsonable({k: v for k, v in resolve_data_config(dict(data_config)).items()
                                     if k in DATA_CONFIG_KEYS})
        else:
            data_config, transform = eval_transform(model, preprocess)
        check_label_space(model, name)
        digest = tensors_sha256(model.state_dict())
        return cls(model=model, transform=transform, data_config=data_config, tag=None, source="module",
                   model_id=canonical_id(source="module", name=name, tensors_sha256=digest), architecture=name,
                   weights_revision=None, weights_sha256=None, weights_file=None, pretrained_cfg=_jsonable(cfg),
                   num_params=sum(p.numel() for p in model.parameters()))

    def describe(self) -> dict:
        # checkpoint_weights only when it applies, so other results keep their config hash
        extra = {"checkpoint_weights": self.checkpoint_weights} if self.checkpoint_weights else {}
        return {**extra,
            "id": self.model_id, "architecture": self.architecture, "tag": self.tag, "source": self.source,
            "weights_revision": self.weights_revision, "weights_sha256": self.weights_sha256,
            "num_params": self.num_params,
            "pretrained_cfg": {k: v for k, v in self.pretrained_cfg.items()
                               if k in ("hf_hub_id", "architecture", "tag", "license", "num_classes",
                                        "input_size", "test_input_size", "crop_pct", "test_crop_pct")},
        }


def parse_model_name(text: str) -> ModelRef:
    """Split a user-given model name into registry name, Hub repo and revision."""
    import timm

    raw = text.strip()
    if not raw:
        raise BenchError("empty --model; give a timm name such as 'resnet50.a1_in1k' or 'timm/resnet50.a1_in1k'")
    body, _, rev = raw.partition("@")
    rev = rev or None
    if body.startswith("hf-hub:"):
        repo = body[len("hf-hub:"):]
        name = repo.split("/", 1)[1] if repo.startswith("timm/") else None
        return ModelRef(raw, name, repo, rev)
    if "/" in body:
        if body.count("/") != 1:
            raise BenchError(f"model {raw!r} is not a timm name or an org/name Hub repo id")
        name = body.split("/", 1)[1] if body.startswith("timm/") else None
        return ModelRef(raw, name, body, rev)
    # registry name: resolve the default tag and the weights' Hub repo
    arch = body.split(".", 1)[0]
    if not timm.is_model(arch):
        raise NotFoundError(f"unknown timm model {body!r}.{_suggest(body)}")
    cfg = _pretrained_cfg(body)
    if cfg is None:
        raise NotFoundError(f"timm has no pretrained weights named {body!r}.{_suggest(body)}")
    full = f"{cfg.architecture}.{cfg.tag}" if cfg.tag else cfg.architecture
    repo = (cfg.hf_hub_id or "").split("@")[0] or None
    return ModelRef(raw, full, repo, rev)


def given_name(text: str) -> str:
    """The timm name as the user wrote it: no ``hf-hub:`` / ``timm/`` prefix, no ``@revision``, and no
    default tag filled in."""
    body = text.strip().partition("@")[0]
    body = body[len("hf-hub:"):] if body.startswith("hf-hub:") else body
    return body[len("timm/"):] if body.startswith("timm/") else body


def checkpoint_model_id(text: str, weights_sha256: str) -> str:
    """The id of local weights: the name the user gave when it names a tag (``NAME=CHECKPOINT``, a
    list's ``NAME CHECKPOINT``), otherwise the architecture and the file's sha256 prefix
    (``resnet18@sha256:1a2b3c4d5e6f``); never the registry's default pretrained tag, which these
    weights were not loaded from. Two checkpoints of one architecture thus get two ids."""
    name = given_name(text)
    return name if "." in name else f"{name}@sha256:{weights_sha256[:12]}"


def _pretrained_cfg(name: str):
    from timm.models import get_pretrained_cfg

    try:
        return get_pretrained_cfg(name, allow_unregistered=False)
    except Exception:  # noqa: BLE001 - timm raises several types for unknown tags
        return None


def _suggest(name: str) -> str:
    import timm

    arch = name.split(".", 1)[0]
    pool = timm.list_pretrained(f"{arch}*") or timm.list_pretrained()
    close = difflib.get_close_matches(name, pool, n=4, cutoff=0.4)
    if not close:
        return " See timm.list_pretrained() for the names."
    return " Did you mean " + ", ".join(repr(c) for c in close) + "?"


def resolve_model_revision(repo_id: str, revision: str | None) -> str:
    """The 40-character commit sha of ``repo_id`` at ``revision`` (default ``main``)."""
    from huggingface_hub import HfApi, constants, errors

    rev = revision or "main"
    if SHA_RE.match(rev):
        return rev
    cached = _cached_ref(repo_id, rev)
    if constants.HF_HUB_OFFLINE:
        if cached:
            return cached
        raise OfflineError(f"offline (HF_HUB_OFFLINE=1) and no cached copy of model repo {repo_id}@{rev}; "
                           f"run once with network, or pass a local file with --checkpoint{OFFLINE_ROUTE}")
    try:
        return HfApi().model_info(repo_id, revision=rev).sha
    except errors.RepositoryNotFoundError:
        raise NotFoundError(f"model repo {repo_id!r} does not exist on the Hub (or needs a token: set HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise NotFoundError(f"revision {rev!r} does not exist in model repo {repo_id!r}") from None
    except Exception as e:  # noqa: BLE001 - transport errors of whichever HTTP client huggingface_hub uses
        if not (isinstance(e, (OSError, errors.HfHubHTTPError)) or _unreachable(e)):
            raise
        if cached:
            log.warning("Hub unreachable (%s); using the cached %s@%s = %s", type(e).__name__, repo_id, rev, cached)
            return cached
        raise OfflineError(f"cannot reach the Hub to resolve {repo_id}@{rev} ({type(e).__name__}) and nothing is "
                           f"cached; check the network or HF_ENDPOINT, or pass --checkpoint FILE"
                           f"{OFFLINE_ROUTE}") from None


def _cached_ref(repo_id: str, rev: str) -> str | None:
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / rev
    if ref.is_file():
        sha = ref.read_text().strip()
        return sha if SHA_RE.match(sha) else None
    return None


def _cached_weights(repo_id: str, sha: str, preferred: str | None) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    for fn in ((preferred,) if preferred else ()) + WEIGHT_FILES:
        p = try_to_load_from_cache(repo_id, fn, revision=sha)
        if isinstance(p, str) and os.path.isfile(p):
            return p
    return None


def load_classifier(name: str, *, checkpoint: str | os.PathLike | None = None, device: str = "cpu",
                    remap_by_order: bool = False, pretrained: bool = True,
                    checkpoint_weights: str = "model", preprocess: str = "timm") -> LoadedClassifier:
    """Create the model, load pinned weights, check the label space, resolve preprocessing.

    Parameters
    ----------
    name : str
        timm name, ``timm/<name>`` or ``hf-hub:<repo>[@rev]`` (see module docstring).
    checkpoint : path, optional
        Local weights: safetensors, a plain PyTorch state dict or a timm training checkpoint, always
        loaded weights-only (:func:`read_checkpoint`).
    remap_by_order : bool
        Map checkpoint tensors onto the model's state dict by position when key names differ
        (e.g. a port whose tensors are in timm's order); shapes must still match one to one.
    pretrained : bool
        ``False`` builds random weights (tests, throughput benchmarks).
    checkpoint_weights : {"model", "ema"}
        Which weights of a training checkpoint to score (default ``model``, as timm's ``validate.py``).
    preprocess : str
        ``"timm"`` (the model's own eval transform) or ``"lance-square"`` (see :func:`eval_transform`).
    """
    import timm

    if checkpoint is not None:
        check_checkpoint_file(checkpoint)  # before any architecture is built (eva_giant: 3.7 GB of RAM)
    ref = parse_model_name(name)
    picked = None
    if checkpoint is not None:
        arch_name = ref.name or (ref.repo_id.split("/", 1)[1] if ref.repo_id else None)
        if arch_name is None or not timm.is_model(arch_name.split(".", 1)[0]):
            raise BenchError(f"--checkpoint needs a timm architecture name as --model, got {name!r}")
        model = timm.create_model(arch_name, pretrained=False)
        entry = load_checkpoint(model, checkpoint, remap_by_order=remap_by_order, weights=checkpoint_weights)
        picked = checkpoint_weights if entry is not None else None
        source, rev, wfile = "checkpoint", None, str(checkpoint)
        wsha = weights_sha256(checkpoint)
        model_id = checkpoint_model_id(name, wsha)
    elif not pretrained:
        arch_name = ref.name or name
        model = timm.create_model(arch_name, pretrained=False)
        source, rev, wfile, wsha, model_id = "random", None, None, None, arch_name
    else:
        if ref.repo_id is None:
            raise BenchError(f"timm has no Hub weights for {name!r}; pass --checkpoint FILE")
        rev = resolve_model_revision(ref.repo_id, ref.revision)
        model = _create_pinned(ref, rev)
        arch_name = ref.name or model.pretrained_cfg.get("architecture", ref.repo_id)
        preferred = model.pretrained_cfg.get("hf_hub_filename")
        wfile = _cached_weights(ref.repo_id, rev, preferred)
        wsha = weights_sha256(wfile) if wfile else None
        source, model_id = "hf-hub", ref.repo_id
    check_label_space(model, model_id)
    model.eval().to(device)
    cfg = dict(model.pretrained_cfg or {})
    data_config, transform = eval_transform(model, preprocess)
    arch, _, tag = (ref.name or arch_name).partition(".")
    if source == "checkpoint":  # only a tag the user named: the registry's default tag is not these weights
        tag = given_name(name).partition(".")[2]
    return LoadedClassifier(
        model=model, transform=transform, data_config=data_config, model_id=model_id, architecture=arch,
        tag=tag or (None if source == "checkpoint" else cfg.get("tag")), source=source, weights_revision=rev, weights_sha256=wsha, weights_file=wfile,
        num_params=sum(p.numel() for p in model.parameters()), pretrained_cfg=_jsonable(cfg),
        checkpoint_weights=picked,
    )


def _create_pinned(ref: ModelRef, sha: str):
    import timm
    from huggingface_hub import errors

    try:
        if ref.name is not None and _pretrained_cfg(ref.name) is not None:
            # registry cfg (incl. test size) with the weights pinned at the resolved sha
            return timm.create_model(ref.name, pretrained=True,
                                     pretrained_cfg_overlay={"hf_hub_id": f"{ref.repo_id}@{sha}"})
        return timm.create_model(f"hf-hub:{ref.repo_id}@{sha}", pretrained=True)
    except errors.LocalEntryNotFoundError:
        raise OfflineError(f"weights of {ref.repo_id}@{sha[:12]} are not in the local cache and the Hub is not "
                           f"reachable; run once with network or pass --checkpoint FILE{OFFLINE_ROUTE}") from None
    except errors.EntryNotFoundError as e:
        raise NotFoundError(f"{ref.repo_id}@{sha[:12]} has no timm weights/config ({e}); is it a timm model repo?") from None


PREPROCESS = PROTOCOL_OPTIONS["preprocess"]  # one list: eval_transform builds them, the result schema checks them


def eval_transform(model, preprocess: str = "timm") -> tuple[dict, object]:
    """The eval data config and the transform built from it (``timm.data.create_transform``).

    - ``"timm"``: timm's own eval config at test size (``resolve_data_config(..., use_test_size=True)``):
      resize the shorter side, centre crop.
    - ``"lance-square"``: the setting of LANCE's released evaluation walkthrough (Prabhu et al. 2023):
      the whole image squashed to 224 x 224 (torchvision ``Resize((224, 224))``, bilinear) with no crop,
      then ImageNet mean/std (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225) for every model, as the
      walkthrough's ``Normalize`` does. Expressed as timm's ``crop_mode="squash"`` with
      ``crop_pct=1.0``, so the data config (hashed into the result's ``config_hash``) says it.
    - ``"lance-square-model-norm"``: the same squash with the model's own mean/std (0.5 for the
      augreg ViTs): what the model was trained with, not what the authors ran.
    """
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform, resolve_data_config

    cfg = resolve_data_config({}, model=model, use_test_size=True)
    if preprocess in ("lance-square", "lance-square-model-norm"):
        cfg = {**cfg, "input_size": (3, 224, 224), "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash"}
        if preprocess == "lance-square":
            cfg.update(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    elif preprocess != "timm":
        raise BenchError(f"unknown preprocessing {preprocess!r}; choose one of {', '.join(PREPROCESS)}")
    transform = create_transform(**cfg, is_training=False)
    return _jsonable({k: cfg[k] for k in DATA_CONFIG_KEYS if k in cfg}), transform


def check_label_space(model, model_id: str) -> None:
    n = getattr(model, "num_classes", None)
    if n != 1000:
        raise BenchError(f"model {model_id} has {n} output classes, not the 1000 ImageNet-1k classes; bench scores "
                         "ImageNet-1k classifiers only (pick an *_in1k or *_ft_in1k tag)")


CHECKPOINT_WEIGHTS = ("model", "ema")
# Entries of a training checkpoint, in the order timm's ``load_state_dict`` looks for them.
_EMA_ENTRIES = ("state_dict_ema", "model_ema")
_MODEL_ENTRIES = ("state_dict", "model", "model_state_dict")


def _torch_load_safely(path: Path):
    """``torch.load(weights_only=True)`` with the harmless globals of timm training checkpoints allowed.

    timm's ``train.py`` (``CheckpointSaver``) stores its ``argparse.Namespace`` under ``args``; a
    Namespace only holds attributes, and weights-only unpickling still checks each of its values.
    Nothing is ever fully unpickled: any other global is refused and named.
    """
    import argparse
    import pickle

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception:  # noqa: BLE001 - not a pickle torch can scan: the file is damaged, said below
            unsafe = []
        unsafe = [g for g in unsafe if g != "argparse.Namespace"]
        if not unsafe:
            raise
        raise BenchError(f"checkpoint {str(path)!r} holds Python objects ({', '.join(unsafe[:3])}) that weights-only "
                         "loading refuses (bench never unpickles arbitrary code); save the weights alone: "
                         "torch.save(model.state_dict(), 'weights.pth') or safetensors") from None


_SHA_MEMO: dict[tuple, str] = {}
_SHA_LOCK = threading.Lock()
_SHA_MEMO_MAX = 4096


def weights_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a weights file, read once per process for each (file, size, mtime_ns).

    A sweep needs it when it checks the model list, when it loads each model and when a chunk
    reloads a model it had to drop (``max_resident``): one read of a multi-GB file instead of three.
    A file rewritten in place has a new size or mtime and is hashed again. Thread-safe (the next
    chunk's models load in a background thread).
    """
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _SHA_LOCK:
        digest = _SHA_MEMO.get(key)
    if digest is None:
        digest = sha256_file(real)
        with _SHA_LOCK:
            if len(_SHA_MEMO) >= _SHA_MEMO_MAX:
                _SHA_MEMO.clear()
            _SHA_MEMO[key] = digest
    return digest


def check_checkpoint_file(path: str | os.PathLike) -> Path:
    """A local checkpoint exists, is a regular file, is readable, is not empty and is at most
    ``MAX_CHECKPOINT_BYTES``; anything else is one line naming the file. Cheap (a stat and a
    1-byte read): called before the architecture is built."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise BenchError(f"checkpoint {str(path)!r} does not exist; check the path") from None
    except OSError as e:
        raise BenchError(f"checkpoint {str(path)!r} cannot be read ({e.strerror}); check the path") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
        raise BenchError(f"checkpoint {str(path)!r} is {kind}; give the weights file (.safetensors, .pth, .bin)")
    if st.st_size == 0:
        raise BenchError(f"checkpoint {str(path)!r} is empty (0 bytes); the download or copy did not finish")
    if st.st_size > MAX_CHECKPOINT_BYTES:
        raise BenchError(f"checkpoint {str(path)!r} is {st.st_size} bytes, over the {MAX_CHECKPOINT_BYTES >> 30} GiB "
                         "limit for a classifier's weights; is it the right file?")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise BenchError(f"checkpoint {str(path)!r} cannot be read ({e.strerror}); fix its permissions") from None
    return path


def read_checkpoint(path: str | os.PathLike, *, weights: str = "model") -> tuple[dict, str | None]:
    """A checkpoint file -> ``(state_dict, entry)``; ``entry`` names the training-checkpoint key used.

    Reads safetensors files, plain state dicts and training checkpoints as timm's ``train.py``
    writes them (``state_dict``, ``state_dict_ema``, ``args``, ``optimizer``, ``epoch`` ...), always
    weights-only. ``weights`` picks ``"model"`` (the trained weights, timm ``validate.py``'s default)
    or ``"ema"`` (``state_dict_ema``, as ``validate.py --use-ema``). ``module.``/``_orig_mod.``
    prefixes (DDP, torch.compile) are removed with timm's ``clean_state_dict``.
    """
    from timm.models import clean_state_dict

    path = Path(path)
    if weights not in CHECKPOINT_WEIGHTS:
        raise BenchError(f"--checkpoint-weights must be one of {', '.join(CHECKPOINT_WEIGHTS)}, got {weights!r}")
    check_checkpoint_file(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            sd = load_file(str(path))
        else:
            sd = _torch_load_safely(path)
    except BenchError:
        raise
    except Exception as e:  # noqa: BLE001 - any decode failure is the user's file
        raise BenchError(f"cannot read checkpoint {str(path)!r} ({type(e).__name__}: {first_line(e)}); expected a "
                         "safetensors file, a PyTorch state dict or a timm training checkpoint") from None
    entry = None
    if isinstance(sd, dict):
        ema = next((k for k in _EMA_ENTRIES if isinstance(sd.get(k), dict)), None)
        plain = next((k for k in _MODEL_ENTRIES if isinstance(sd.get(k), dict)), None)
        if weights == "ema":
            if ema is None:
                raise BenchError(f"checkpoint {path.name} has no EMA weights (no state_dict_ema entry); drop "
                                 "--checkpoint-weights ema to score its model weights")
            entry = ema
        elif plain is not None:
            entry = plain
        elif ema is not None:
            raise BenchError(f"checkpoint {path.name} holds only EMA weights ({ema}); pass --checkpoint-weights ema")
    if entry is not None:
        sd = sd[entry]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise BenchError(f"checkpoint {str(path)!r} is not a state dict of tensors (nor a training checkpoint with "
                         "a state_dict entry)")
    return clean_state_dict(sd), entry


def load_checkpoint(model: torch.nn.Module, path: str | os.PathLike, *, remap_by_order: bool = False,
                    weights: str = "model") -> str | None:
    """Load a local checkpoint safely and strictly (see :func:`read_checkpoint`); mismatches are one error.

    Returns the training-checkpoint entry that was loaded (``None`` for a plain state dict).
    """
    path = Path(path)
    sd, entry = read_checkpoint(path, weights=weights)
    own = model.state_dict()
    if remap_by_order and set(sd) != set(own):
        if len(sd) != len(own):
            raise BenchError(f"checkpoint {path.name} has {len(sd)} tensors, model has {len(own)}; cannot map by order")
        sd = dict(zip(own.keys(), sd.values()))
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in sd and sd[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys (e.g. {unexpected[0]})")
        if shapes:
            parts.append(f"{len(shapes)} shape mismatches (e.g. {shapes[0]})")
        hint = " (keys differ but count matches: try --remap-by-order)" if (
            not remap_by_order and len(sd) == len(own) and not shapes) else ""
        raise BenchError(f"checkpoint {path.name} does not fit {type(model).__name__}: {'; '.join(parts)}{hint}")
    model.load_state_dict(sd, strict=True)
    return entry



def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items() if not callable(v)}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
