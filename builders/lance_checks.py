"""LANCE's image checks (the "checks and balances", Sec. 3.2 and Algorithm 1; ``docs/builders.md``).

With CLIP embeddings of the null-text reconstruction x (the "original" in the released code's filters),
an edit x', the caption c and the edited caption c': cos(x, x') >= 0.7, cos(x, c) and cos(x', c') >= 0.2,
the direction cos(x' - x, c' - c) >= 0.2 (Eq. 2 up to its sign typo), and x' closer to the edit words
than to the removed ones. Of the f values that pass, the highest directional similarity is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CheckThresholds:
    image_image: float = 0.7
    image_text: float = 0.2
    direction: float = 0.2
    closer_to_edit: bool = True


@dataclass
class CheckScores:
    f: float
    clip_img_sim: float
    clip_sim_0: float
    clip_sim_1: float
    clip_dir_sim: float
    edit_word_sim: float | None
    original_word_sim: float | None
    passed: bool


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def score_edits(scorer, reconstruction, edited: list, fs: list[float], caption: str, edited_caption: str,
                original_words: str, edit_words: str, th: CheckThresholds = CheckThresholds()) -> list[CheckScores]:
    """Scores and the pass/fail verdict of every f of a sweep."""
    imgs = scorer.encode_images([reconstruction, *edited])
    texts = [caption, edited_caption, edit_words] + ([original_words] if original_words else [])
    t = scorer.encode_texts(texts)
    e0, ep = imgs[0], imgs[1:]
    tc, te, tw = t[0], t[1], t[2]
    to = t[3] if original_words else None
    out = []
    for f, e in zip(fs, ep):
        s = CheckScores(f=f, clip_img_sim=_cos(e0, e), clip_sim_0=_cos(e0, tc), clip_sim_1=_cos(e, te),
                        clip_dir_sim=_cos(e - e0, te - tc), edit_word_sim=_cos(e, tw),
                        original_word_sim=_cos(e, to) if to is not None else None, passed=False)
        s.passed = (s.clip_img_sim >= th.image_image and s.clip_sim_0 >= th.image_text and s.clip_sim_1 >= th.image_text
                    and s.clip_dir_sim >= th.direction
                    and (not th.closer_to_edit or s.original_word_sim is None or s.edit_word_sim > s.original_word_sim))
        out.append(s)
    return out


def choose(scores: list[CheckScores]) -> CheckScores | None:
    """The passing f with the highest directional similarity, or None."""
    passing = [s for s in scores if s.passed]
    return max(passing, key=lambda s: s.clip_dir_sim) if passing else None
