"""IN-G class prompts and seed captions (Wiles, Albuquerque, Gowal; ``docs/builders.md``): the class prompt with
the WordNet 3.0 grandparent of smallest offset (``genshift.imagenet``); a seed caption is the class prompt and at
most two generated sentences, lower-cased, from a captioner continuing the prompt or from a CSV/JSONL file.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from genshift import imagenet
from genshift.errors import BenchError

TEMPLATE = "a realistic photograph of {article} {name} ({parent})."
CAPTIONING = ("three-shot", "single-image")  # the paper's few-shot prompt (shots()), or the image alone
DECODING = {"num_beams": 5, "min_new_tokens": 8, "max_new_tokens": 40}  # the IN-G captioner's


@dataclass(frozen=True)
class ClassPrompt:
    label: int
    wnid: str
    name: str
    parent_wnid: str
    parent_name: str
    text: str


def class_prompt(label: int, *, an: bool = False) -> ClassPrompt:
    c = imagenet.get_class(label)
    if c.parent is None:
        raise BenchError(f"class {label} ({c.wnid}) has no WordNet grandparent in the shipped hierarchy; it cannot "
                         "be given an IN-G prompt")
    parent = imagenet.synset_name(c.parent)
    article = "an" if an and c.lemma[:1].lower() in "aeiou" else "a"
    return ClassPrompt(label, c.wnid, c.lemma, c.parent, parent,
                       TEMPLATE.format(article=article, name=c.lemma, parent=parent))


def seed_caption(prompt: str, continuation: str, *, max_sentences: int = 2) -> str:
    """Class prompt + at most ``max_sentences`` generated sentences, lower-cased."""
    cont = continuation.strip()
    if cont.lower().startswith(prompt.lower()):
        cont = cont[len(prompt):].strip()
    sentences = [s.strip(" .") for s in re.split(r"(?<=\.)\s+", cont) if s.strip(" .")]
    tail = " ".join(f"{s.lower()}." for s in sentences[:max_sentences])
    return f"{prompt} {tail}".strip()


def check_caption(label: int, caption: str, *, an: bool = False) -> str:
    """A caption must start with its class prompt (the paper forces it); one clear error otherwise."""
    prompt = class_prompt(label, an=an).text
    if not caption.lower().startswith(prompt.lower()):
        raise BenchError(f"caption {caption[:60]!r} for class {label} does not start with its class prompt "
                         f"{prompt!r}; IN-G captions continue the class prompt")
    return caption


def _label(text, where: str) -> int:
    try:
        return imagenet.parse_class(text)
    except BenchError as e:
        raise BenchError(f"{where}: {e}") from None


def read_captions(path: str | Path, *, an: bool = False) -> list[tuple[int, str]]:
    """Seed captions from a CSV (class,caption) or JSONL file; each must continue its class prompt."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"caption file {str(path)!r} does not exist")
    rows: list[tuple[int, str]] = []
    if path.suffix == ".jsonl":
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rows.append((_label(obj["class"], f"{path.name}:{i}"), str(obj["caption"])))
            except (ValueError, KeyError, TypeError) as e:
                raise BenchError(f"{path.name}:{i}: expected {{\"class\": ..., \"caption\": ...}} ({e})") from None
    else:
        with open(path, newline="") as f:
            for i, row in enumerate(csv.reader(f), 1):
                if not row or (i == 1 and row[0].strip().lower() == "class"):
                    continue
                if len(row) < 2:
                    raise BenchError(f"{path.name}:{i}: expected 'class,caption'")
                rows.append((_label(row[0], f"{path.name}:{i}"), row[1]))
    if not rows:
        raise BenchError(f"caption file {path} holds no captions")
    return [(y, check_caption(y, c.strip(), an=an)) for y, c in rows]


def shots() -> tuple[list, list[dict]]:
    """The captioner's three shots (package data ``in_g_shots.yaml``): ``[(PIL image, caption)]`` and
    their record for the suite's provenance (image file, its sha256, caption)."""
    import hashlib
    from importlib import resources

    import yaml
    from PIL import Image

    data = resources.files("genshift.builders").joinpath("_data")
    out, record = [], []
    for s in yaml.safe_load(data.joinpath("in_g_shots.yaml").read_text()):
        raw = data.joinpath(s["image"]).read_bytes()
        out.append((Image.open(io.BytesIO(raw)).convert("RGB"), s["caption"]))
        record.append({"image": s["image"], "sha256": hashlib.sha256(raw).hexdigest(), "caption": s["caption"]})
    return out, record


def caption_batch(n_shots: int) -> int:
    """Images captioned per call: 16 images through the vision model per call, shots included (three-shot: 4),
    so that three-shot captioning needs about the memory of single-image captioning (``bench build --preflight``)."""
    return 16 // (1 + n_shots)


def captioner_fn(captioner, shots: Sequence = ()) -> Callable[[list, str], list[str]]:
    """``caption(images, class prompt) -> texts`` by a :class:`~genshift.builders.captioner.Captioner` with the
    IN-G decoding and ``shots`` (:func:`shots`) before each image; images are files or encoded bytes."""
    from PIL import Image

    batch = caption_batch(len(shots))

    def caption(images: list, prefix: str) -> list[str]:
        out = []
        for a in range(0, len(images), batch):
            pil = [Image.open(io.BytesIO(im) if isinstance(im, bytes) else im) for im in images[a:a + batch]]
            out += captioner.caption(pil, prefix=prefix, shots=shots, **DECODING)
        return out

    return caption
