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
    e0, *images = scorer.encode_images([reconstruction, *edited])
    texts = [caption, edited_caption, edit_words] + ([original_words] if original_words else [])
    tc, te, tw, *to = scorer.encode_texts(texts)
    out = []
    for f, e in zip(fs, images):
        img, sim0, sim1, direction = _cos(e0, e), _cos(e0, tc), _cos(e, te), _cos(e - e0, te - tc)
        word, original = _cos(e, tw), (_cos(e, to[0]) if to else None)
        passed = (img >= th.image_image and sim0 >= th.image_text and sim1 >= th.image_text
                  and direction >= th.direction and (not th.closer_to_edit or original is None or word > original))
        out.append(CheckScores(f, img, sim0, sim1, direction, word, original, passed))
    return out


def choose(scores: list[CheckScores]) -> CheckScores | None:
    """The passing f with the highest directional similarity, or None."""
    passing = [s for s in scores if s.passed]
    return max(passing, key=lambda s: s.clip_dir_sim) if passing else None
