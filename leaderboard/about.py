"""The leaderboard's About tab (fixed Markdown; ``docs/leaderboard.md`` says the same for maintainers)."""

ABOUT = r"""
**What is ranked.** Only entries that are *verified* and *complete* are ranked, and only among themselves:
verified means a maintainer re-ran a random sample of the entry's images through the model and signed its record
(`verification.json`) with a key this board trusts, for the result file as it is now; complete means every config of
the suite was scored, with no `--limit-per-class`. Rank intervals are computed over the same set. Everything else
(unverified, partial, stale) is listed as a community entry, with its own numbers and no rank, because anyone can write
a result file. Construction models (used to build, mine or filter the suite) are never ranked. Filters hide rows;
they never re-rank.

**One entry per model.** Entries are keyed by the model's canonical identity: a Hub repo id, or
`name@sha256:<digest of the tensors>` for local weights, which are marked "local weights", never shown under or linked
to a Hub model. The same weights under two ids are listed and ranked once (a verified entry wins, then Hub weights
over a local copy, then the record signed last), and the entry shown says so in its flags. A result of the same model
under another protocol (e.g. other bootstrap settings) is on a board of its own.

**How entries are verified.** `bench review` (or a maintainer with `bench verify --recheck N --sign KEY`) checks the
result against the suite's trusted manifest, recomputes every metric, re-runs a fresh random sample of images through
the model at the recorded weights, and signs the record this page reads: the numbers, the per-image correctness behind
the rank intervals, and the hashes of the files. This page checks the signature and the result file's hash; a
predictions file is hashed when a view reads it (the model drilldown), and one that changed marks the entry stale at
once.

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
