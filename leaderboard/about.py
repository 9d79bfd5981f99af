"""The leaderboard's About tab: what is ranked and why, how entries are verified, each metric with its
paper, how to submit (fixed Markdown; ``docs/leaderboard.md`` says the same for maintainers)."""

ABOUT = r"""
**What is ranked.** Only entries that are *verified* and *complete* are ranked, and only among themselves:
verified means a maintainer re-ran a random sample of the entry's images through the model and signed a stamp
(`verification.json`) with a key this board trusts, naming the result and predictions files exactly as they are
now; complete means every config of the suite was scored, with no `--limit-per-class`. Rank intervals are computed
over the same set. Everything else (unverified, partial, stale stamps) is listed as a community entry, with its
numbers and flags and no rank, because anyone can write a result file: numbers that recompute from their own
predictions can still be forged predictions. Construction models (used to build, mine or filter the suite) are
never ranked. Filters hide rows; they never re-rank.

**How entries are verified.** Every entry is checked when the board loads, the way `bench verify` checks it: the
schema, the predictions files against their sha256, the predictions against the suite's trusted manifest, and every
metric recomputed from the predictions. `bench review` (or a maintainer with `bench verify --recheck N --sign KEY`)
re-runs a fresh random sample of images through the model at the recorded weights and signs the stamp with the
maintainer key. When any file of an entry changes, the board checks it again before showing it. Of several entries
for one model, a verified one wins, then the most recently signed stamp, then the first entry path; never a field of
the result. Entries with the same weights under different model ids are flagged.

**Metrics.**
- ImageNet\* (Vendrow et al., 2023, *Dataset Interfaces: Diagnosing Model Failures Using Controllable
  Counterfactual Generation*): accuracy per shift, ranked by mean acc@1 over the shifts; a model's absolute impact
  of a shift is acc(base) − acc(shift).
- LANCE (Prabhu et al., 2023, *LANCE: Stress-testing Visual Models by Generating Language-guided
  Counterfactual Images*): ranked by Δacc@1, counterfactual minus original accuracy; Δp per edit type.
- IN-G (Wiles et al., 2022, *Discovering Bugs in Vision Models using Off-the-shelf Image Generation and
  Captioning*): ranked by the top-3 failure rate (lower is better).
- Effective robustness (Taori et al., 2020, *Measuring Robustness to Natural Distribution Shifts in Image
  Classification*): shift accuracy minus the linear (or probit) ID/OOD fit's prediction, in percentage points.
- Failure directions (Jain et al., ICLR 2023, *Distilling Model Failures as Directions in Latent Space*): per
  class a linear SVM on CLIP embeddings separating the model's mistakes; shown as "not significant" when it is not
  stronger than its permutation null.

**How to submit.** Score every config of the suite with `bench eval --model <timm name> --suite <suite>` (no
`--limit-per-class`), then `bench submit <run folder> --repo <results repo>` opens a pull request. The review service
checks it, re-runs a sample of its images and signs it; from the next pinned results revision it is ranked.
"""
