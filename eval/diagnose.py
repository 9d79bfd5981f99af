r"""Analyses of a result that never change its scores. ``bench diagnose`` (``docs/leaderboard.md``, "Failure
directions in pictures"): failure directions (Jain et al., ICLR 2023) from a result's predictions and CLIP
embeddings (open_clip; default OpenAI ViT-B/32) of its images, written as ``diagnose.json`` and ``diagnose.html``
next to the result (``genshift.eval.diagnose_report``). Per class, a linear SVM on the image embeddings predicts
whether the model got an image right; its normal vector is the class's failure direction (Sec. 2), its
cross-validated balanced accuracy the direction's *strength* (Sec. 2.1), and the captions whose embedding
difference to a reference caption has the most negative / positive decision value name the hard / easy
subpopulation (Sec. 2.2, :math:`\hat c = (c - r)/\lVert c - r\rVert_2`). Fit as the authors' code does it, with
guards it lacks; image views and precisions: ``docs/reproducing.md``, "Failure directions". And LANCE's
class-level insight (Sec. 4.2, Fig. 6, :func:`result_clusters`): K-means clusters of edits (CLIP text direction
edit words - replaced words) ranked by the model's mean Δp, stored under ``analysis``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from torchvision.transforms import functional as F
from tqdm.auto import tqdm

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError
from genshift.eval import diagnose_report, metrics
from genshift.eval.inference import make_transform
from genshift.eval.predictions import read_predictions, topk_matrix
from genshift.eval.results import load_result
from genshift.eval.suite_trust import open_suite, reopen_suite
from genshift.fsutil import atomic_path, atomic_write_json, canonical_json, sha256_bytes, sha256_file
from genshift.pixels import to_rgb
from genshift.suite_format import LocalSuite, read_row_group

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
    """Image ids and embeddings of a config, computed once, then read from the cache: an ``.npz`` (ids +
    unnormalised float32) per suite manifest, config, CLIP model, image view and precision."""
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


C_GRID = tuple(float(c) for c in np.logspace(-6, 0, 7))


@dataclass(frozen=True)
class DirectionOptions:
    c_grid: tuple[float, ...] = C_GRID
    cv: int = 2
    min_errors: int = 2
    min_correct: int = 2
    whiten: bool = True
    normalize: bool = True
    caption_whitening: bool = True   # the code's behaviour; False = the paper's formula
    reference_caption: str = "code"  # "code": 'a photo of a <class name>'; "paper": 'a photo of a <ancestor>'
    n_null: int = 10                 # permutation repeats for the null strength (0 = skip)
    k_images: int = 5
    k_captions: int = 10
    seed: int = 0


@dataclass
class Whitening:
    mean: np.ndarray
    std: np.ndarray
    whiten: bool = True
    normalize: bool = True

    @classmethod
    def fit(cls, reference: np.ndarray, *, whiten: bool = True, normalize: bool = True) -> Whitening:
        ref = np.asarray(reference, dtype=np.float64)
        mean = ref.mean(axis=0)
        std = (ref - mean).std(axis=0, ddof=1)
        return cls(mean, np.where(std > 0, std, 1.0), whiten, normalize)

    def __call__(self, e: np.ndarray) -> np.ndarray:
        z = np.asarray(e, dtype=np.float64)
        if self.whiten:
            z = (z - self.mean) / self.std
        if self.normalize:
            z = z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
        return z


def search_svm(z: np.ndarray, correct: np.ndarray, opts: DirectionOptions):
    """The C search of the authors' code; returns ``(strength, C, fitted SVC or None)``."""
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.svm import SVC

    best, best_c = -np.inf, None
    for c in opts.c_grid:
        svm = SVC(kernel="linear", C=c, class_weight="balanced")
        scores = cross_val_score(svm, z, correct, cv=StratifiedKFold(opts.cv, shuffle=False),
                                 scoring="balanced_accuracy")
        mean = float(np.mean(scores))
        if mean > best:  # strictly better: ties keep the smallest C
            best, best_c = mean, c
    if best_c is None:
        return float("nan"), None, None
    return best, best_c, SVC(kernel="linear", C=best_c, class_weight="balanced").fit(z, correct)


@lru_cache(maxsize=1)
def _caption_table() -> dict:
    text = resources.files("genshift").joinpath("_data", "failure_direction_captions.yaml").read_text()
    return yaml.safe_load(text)


def candidate_captions(label: int, *, reference: str = "code") -> tuple[str, list[str]]:
    """``(reference caption, candidate captions)`` for an ImageNet class. ``reference="code"`` (default): "a photo
    of a <class name>" (the authors' code); ``"paper"``: "a photo of a <ancestor>" (the appendix)."""
    if reference not in ("code", "paper"):
        raise ValueError(f"reference must be 'code' or 'paper', got {reference!r}")
    table = _caption_table()
    cls = imagenet.get_class(label)
    ancestor = cls.fd_ancestor or "entity"
    noun = ancestor.replace("_", " ")
    preps = table["common_prepositions"] + table["ancestor_prepositions"].get(ancestor, [])
    caps = [" ".join(p for p in ("a photo of a", adj, noun, prep) if p)
            for adj in table["adjectives"] for prep in preps]
    ref = f"a photo of a {cls.name}" if reference == "code" else f"a photo of a {noun}"
    return ref, [c for c in dict.fromkeys(caps) if c != ref]


@dataclass
class ClassDirection:
    label: int
    status: str
    n: int
    n_errors: int
    strength: float | None = None
    null_mean: float | None = None
    null_p95: float | None = None
    C: float | None = None
    hardest: list[str] = field(default_factory=list)
    easiest: list[str] = field(default_factory=list)
    hard_captions: list[tuple[str, float]] = field(default_factory=list)
    easy_captions: list[tuple[str, float]] = field(default_factory=list)
    proxy: dict | None = None


def class_direction(label: int, ids: Sequence[str], emb: np.ndarray, correct: np.ndarray, white: Whitening,
                    opts: DirectionOptions, *, encode_text: Callable[[list[str]], np.ndarray] | None = None
                    ) -> ClassDirection:
    """Fit one class's direction, rank its images and (with ``encode_text``) its captions."""
    order = np.argsort(np.asarray(ids))
    ids = [ids[i] for i in order]
    z = white(emb[order])
    y = np.asarray(correct, dtype=int)[order]
    n_err = int((y == 0).sum())
    out = ClassDirection(label=int(label), status="ok", n=int(y.size), n_errors=n_err)
    too_few = n_err < opts.min_errors or y.size - n_err < opts.min_correct
    strength, c, svm = (None, None, None) if too_few else search_svm(z, y, opts)
    if svm is None:
        out.status = "skipped"
        return out
    out.strength, out.C = strength, c
    if opts.n_null:
        rng = np.random.default_rng(opts.seed + int(label))
        null = [search_svm(z, rng.permutation(y), opts)[0] for _ in range(opts.n_null)]
        out.null_mean, out.null_p95 = float(np.nanmean(null)), float(np.nanquantile(null, 0.95))
    rank = np.argsort(svm.decision_function(z), kind="stable")
    out.hardest = [ids[i] for i in rank[: opts.k_images]]
    out.easiest = [ids[i] for i in rank[::-1][: opts.k_images]]
    if encode_text is not None:
        ref, caps = candidate_captions(label, reference=opts.reference_caption)
        t = encode_text([ref, *caps])
        diff = t[1:] - t[0]
        d = (white(diff) if opts.caption_whitening  # the code's pre-processing; else the paper's normalisation
             else diff / np.maximum(np.linalg.norm(diff, axis=-1, keepdims=True), 1e-12))
        values = svm.decision_function(d)
        srt = np.argsort(values, kind="stable")
        out.hard_captions = [(caps[i], float(values[i])) for i in srt[: opts.k_captions]]
        out.easy_captions = [(caps[i], float(values[i])) for i in srt[::-1][: opts.k_captions]]
        out.proxy = _proxy(emb[order], y, t[1 + srt[0]], t[1 + srt[-1]], k=max(1, y.size // 5))
    return out


def _proxy(emb: np.ndarray, correct: np.ndarray, hard_text: np.ndarray, easy_text: np.ndarray, *, k: int) -> dict:
    """Validation proxy (Fig. 7b): accuracy of the k images closest to the hard vs the easy caption."""
    e = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)

    def acc_near(t):
        t = t / max(np.linalg.norm(t), 1e-12)
        return float(correct[np.argsort(-(e @ t), kind="stable")[:k]].mean())

    return {"k": int(k), "hard_caption_accuracy": acc_near(hard_text), "easy_caption_accuracy": acc_near(easy_text)}


CRITERIA = ("top1", "top3", "parent")


def correctness(table, criterion: str) -> np.ndarray:
    """Per-image 'model was right' under a criterion (IN-G suites: top-3 or WordNet parent)."""
    rank = table["true_rank"].to_numpy()
    if criterion == "top1":
        return rank == 0
    if criterion == "top3":
        return rank < 3
    if criterion == "parent":
        return ~metrics.parent_failures(table["label"].to_numpy().astype(np.int64), topk_matrix(table).astype(np.int64))
    raise BenchError(f"unknown criterion {criterion!r}; use one of {', '.join(CRITERIA)}")


def parse_whiten_reference(text: str | None) -> tuple[str | None, list[str]] | None:
    """``--whiten-reference``: None / ``analysed`` (the analysed images), ``CONFIG[,CONFIG]`` (configs
    of the result's suite) or ``SUITE:CONFIG[,CONFIG]`` (another suite: folder, registry or Hub id)."""
    if text is None or text == "analysed":
        return None
    suite, _, configs = text.rpartition(":")
    names = [c.strip() for c in configs.split(",") if c.strip()]
    if not names:
        raise BenchError(f"--whiten-reference {text!r}: expected 'analysed', CONFIG[,CONFIG] or SUITE:CONFIG[,CONFIG]")
    return suite or None, names


def diagnose(result_path: str | Path, *, encoder: ClipEncoder, cache_dir: str | Path, configs: list[str] | None = None,
             classes: list[int] | None = None, criterion: str = "top1", options: DirectionOptions | None = None,
             suite: str | None = None, mask: str | None = None, progress: bool = True,
             image_view: str = "classifier-square", whiten_reference: str | None = None) -> tuple[dict, Path]:
    """Failure directions of one result. ``image_view``: how CLIP sees the images
    (:class:`ImageView`; default the authors' square resize of the classifier's input).
    ``whiten_reference``: the images whose CLIP statistics whiten the embeddings
    (:func:`parse_whiten_reference`; the authors used the training split; default: the analysed images)."""
    options = options or DirectionOptions()
    path = Path(result_path)
    path = path / "result.json" if path.is_dir() else path
    result = load_result(path)
    entries = {p["config"]: p for p in result["predictions"]}
    configs = configs or list(entries)
    for c in configs:
        if c not in entries:
            raise BenchError(f"config {c!r} is not in the result (has {', '.join(entries)})")
        f = path.parent / entries[c]["path"]
        if not f.is_file() or sha256_file(f) != entries[c]["sha256"]:
            raise IntegrityError(f"{entries[c]['path']} is missing or does not match the result's sha256; run "
                                 "bench verify")
    ref = parse_whiten_reference(whiten_reference)
    own_ref = ref is not None and ref[0] is None
    info = reopen_suite(result, suite=suite, mask=mask,
                        configs=tuple(dict.fromkeys(configs + (ref[1] if own_ref else []))))
    view = ImageView(image_view, result["data_config"] if image_view == "classifier-square" else None)

    ids_all, emb_all, labels_all, right_all = [], [], [], []
    where: dict[str, str] = {}  # image id -> the config it was read from (for thumbnails)
    for c in configs:
        t = read_predictions(path.parent / entries[c]["path"])
        if result["protocol"]["scoring"]["filter"]:
            t = t.filter(t["keep"])
        ids, emb = suite_image_embeddings(info.suite, c, encoder, cache_dir=cache_dir, view=view)
        pos, scored = {i: k for k, i in enumerate(ids)}, t["image_id"].to_pylist()
        ids_all += scored
        where.update({i: c for i in scored if i not in where})
        emb_all.append(emb[[pos[i] for i in scored]])
        labels_all.append(t["label"].to_numpy().astype(np.int64))
        right_all.append(correctness(t, criterion))
    emb, labels, right = (np.concatenate(parts) for parts in (emb_all, labels_all, right_all))
    if ref is None:
        ref_emb, ref_desc = emb, {"images": "the scored images of the analysed configs", "n": int(emb.shape[0])}
    else:
        ref_suite = info.suite if own_ref else open_suite(ref[0], configs=tuple(ref[1])).suite
        unknown = [c for c in ref[1] if c not in ref_suite.configs]
        if unknown:
            raise BenchError(f"--whiten-reference: config {unknown[0]!r} is not in suite {ref_suite.suite_id} "
                             f"(has {', '.join(ref_suite.configs)})")
        ref_emb = np.concatenate([suite_image_embeddings(ref_suite, c, encoder, cache_dir=cache_dir, view=view)[1]
                                  for c in ref[1]])
        ref_desc = {"suite": ref_suite.suite_id, "manifest_sha256": ref_suite.manifest.sha256, "configs": ref[1],
                    "images": "every image of these configs", "n": int(ref_emb.shape[0])}
    if ref_emb.shape[0] < 2:
        raise BenchError(f"the whitening reference has {ref_emb.shape[0]} image(s); name a larger set with "
                         "--whiten-reference")
    white = Whitening.fit(ref_emb, whiten=options.whiten, normalize=options.normalize)
    text_cache: dict[str, np.ndarray] = {}

    def encode_text(texts: list[str]) -> np.ndarray:
        todo = [t for t in texts if t not in text_cache]
        for a in range(0, len(todo), 256):
            for t, e in zip(todo[a:a + 256], encoder.encode_texts(todo[a:a + 256])):
                text_cache[t] = e
        return np.stack([text_cache[t] for t in texts])

    wanted = sorted(set(labels.tolist()) if classes is None else set(classes))
    out = []
    for y in tqdm(wanted, desc="classes", disable=not progress, leave=False):
        sel = np.flatnonzero(labels == y)
        if sel.size == 0:
            continue
        d = class_direction(y, [ids_all[i] for i in sel], emb[sel], right[sel], white, options, encode_text=encode_text)
        out.append({**asdict(d), "wnid": imagenet.wnids()[y], "name": imagenet.names()[y]})
    out.sort(key=lambda d: -(d["strength"] if d["strength"] is not None else -1))
    report = {
        "kind": "genshift-diagnose", "schema_version": 1, "result": str(path), "model": result["model"]["id"],
        "suite": {k: result["suite"][k] for k in ("id", "manifest_sha256")}, "configs": configs,
        "criterion": criterion, "clip": encoder.model_id, "options": asdict(options),
        "embedding": {"image_view": asdict(view), "precision": encoder.resolved_precision()},
        "whitening_reference": ref_desc,
        "n_images": int(labels.size), "classes": out,
    }
    report["thumbnails"] = diagnose_report.thumbnails(info.suite, where, out)
    out_path = path.parent / diagnose_report.REPORT
    atomic_write_json(out_path, report)
    diagnose_report.write_html(report, path.parent / diagnose_report.HTML_REPORT)
    return report, out_path


EXAMPLE_FIELDS = ("pair_id", "edit_type", "original_words", "edit_words")  # shown with each example pair


def cluster_edits(directions, delta_p, *, k: int = 5, seed: int = 0, labels=None, examples: int = 3) -> list[dict]:
    """K-means on edit directions; clusters sorted by decreasing mean Δp.

    Returns per cluster: size, mean Δp, the row indices of its highest-Δp members (``examples``)
    and, if ``labels`` is given, the most common class.
    """
    from sklearn.cluster import KMeans

    x = np.asarray(directions, dtype=np.float64)
    dp = np.asarray(delta_p, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != dp.shape[0]:
        raise ValueError(f"directions must be (n, d) with n = len(delta_p), got {x.shape} and {dp.shape}")
    n = x.shape[0]
    if n == 0:
        return []
    k = max(1, min(k, n))
    norm = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    assign = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(norm)
    out = []
    for c in range(k):
        idx = np.flatnonzero(assign == c)
        if idx.size == 0:
            continue
        top = idx[np.argsort(-dp[idx], kind="stable")][:examples]
        entry = {"cluster": int(c), "size": int(idx.size), "mean_delta_p": float(dp[idx].mean()),
                 "examples": top.tolist()}
        if labels is not None:
            vals, counts = np.unique(np.asarray(labels)[idx], return_counts=True)
            entry["top_label"] = int(vals[counts.argmax()])
        out.append(entry)
    return sorted(out, key=lambda e: -e["mean_delta_p"])


def result_clusters(suite, tables: dict, *, k: int = 5, seed: int = 0) -> dict | None:
    """A LANCE result's analysis ``{"lance_edit_clusters": ...}`` (the family's ``analysis`` target): the
    suite's edit directions clustered, with the predictions' Δp."""
    if not ({"counterfactual", "original"} <= set(tables) and "edit_text_direction" in suite.manifest.features):
        return None
    cols = suite.read_columns("counterfactual", ["image_id", "edit_text_direction", "edit_type", "original_words",
                                                 "edit_words", "pair_id"]).to_pylist()
    meta = {r["image_id"]: r for r in cols}
    orig, cf = tables["original"], tables["counterfactual"]
    match = metrics.pair_up(orig["pair_id"].to_pylist(), cf["pair_id"].to_pylist())
    ok = match >= 0
    dp = metrics.delta_p(orig["true_prob"].to_numpy()[match[ok]], cf["true_prob"].to_numpy()[ok])
    ids = [i for i, good in zip(cf["image_id"].to_pylist(), ok) if good]
    dirs = [meta[i]["edit_text_direction"] for i in ids]
    clusters = cluster_edits(dirs, dp, k=k, seed=seed, labels=cf["label"].to_numpy()[ok])
    for c in clusters:
        c["examples"] = [{"image_id": ids[i], **{f: meta[ids[i]][f] for f in EXAMPLE_FIELDS}, "delta_p": float(dp[i])}
                         for i in c["examples"]]
    return {"lance_edit_clusters": {"method": f"K-means (k={k}) on CLIP text directions edit - original words",
                                    "clusters": clusters}}
