"""``eval.yaml``: what makes a suite's dataset repo a benchmark on the Hub (``docs/hub.md`` section 9), one task per
headline metric of the suite's family (``genshift.families``: ``Family.tasks``)."""

from __future__ import annotations

import yaml
from pydantic import Field

from genshift.errors import IntegrityError
from genshift.families import Task, get_family
from genshift.fsutil import load_yaml
from genshift.schema import Schema, Text, validate
from genshift.suite_format import EVAL_YAML, SPLIT
from genshift.suites import SUITES, declared_scoring

FRAMEWORK = "genshift-bench"
MAX_EVAL_YAML_BYTES = 64 << 10
MAX_YAML_DEPTH = 8
FIX = "delete it and rerun `bench publish`, which writes it from the manifest"
UNITS = "Values: accuracies and failure rates in percent (0-100)."
PP_UNITS = " Differences of two accuracies ({}) in percentage points."


def tasks(family: str, configs: list[str], reference: str | None = None) -> list[Task]:
    """The tasks of a suite of ``family`` with these configs (``genshift.families``)."""
    try:
        return get_family(family).tasks(configs, reference)
    except ValueError as e:
        raise IntegrityError(str(e)) from None


def suite_scoring(manifest) -> tuple[str, str | None]:
    return declared_scoring(manifest, SUITES.get(manifest.suite_id) if manifest.suite_id in SUITES else None)


def suite_tasks(manifest) -> list[Task]:
    family, reference = suite_scoring(manifest)
    return tasks(family, list(manifest.configs), reference)


def render_eval_yaml(manifest, *, name: str | None = None, description: str | None = None) -> str:
    """The ``eval.yaml`` of a suite (name and description from its card)."""
    family = get_family(suite_scoring(manifest)[0])
    suite_task_list = suite_tasks(manifest)
    pp = sorted({m.label for m in (family.metric(t.column.split("/")[0]) for t in suite_task_list) if m.unit == "pp"})
    lines = [description or f"{manifest.suite_id}: how ImageNet classifiers fail under a generated distribution "
             f"shift (genshift-bench suite, metric family {family.name}).",
             UNITS + (PP_UNITS.format(", ".join(pp)) if pp else ""),
             "Tasks: " + "; ".join(f"{t.id} = {t.label}" for t in suite_task_list) + "."]
    doc = {"name": name or manifest.suite_id, "description": "\n".join(lines), "evaluation_framework": FRAMEWORK,
           "tasks": [{"id": t.id, "config": t.config, "split": SPLIT} for t in suite_task_list]}
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


class _TaskEntry(Schema):
    id: Text
    config: Text
    split: Text


class _EvalYaml(Schema):
    """The Hub's ``eval.yaml`` (hub-docs, "Evaluation results")."""

    name: Text
    description: Text
    evaluation_framework: Text
    tasks: list[_TaskEntry] = Field(min_length=1)


def parse_eval_yaml(data: bytes, *, where: str = EVAL_YAML) -> dict:
    """Check an ``eval.yaml`` against the Hub's format: the four keys, non-blank strings, unique task ids."""
    if len(data) > MAX_EVAL_YAML_BYTES:
        raise IntegrityError(f"{where} is {len(data)} bytes, over the {MAX_EVAL_YAML_BYTES} limit; {FIX}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise IntegrityError(f"{where} is not UTF-8; {FIX}") from None
    doc = load_yaml(text, what="the YAML", where=where, max_depth=MAX_YAML_DEPTH)
    if not isinstance(doc, dict):
        raise IntegrityError(f"{where}: not a mapping; {FIX}")
    ids = [t.id for t in validate(_EvalYaml, doc, where=where, fix=FIX).tasks]
    if (twice := next((i for i in ids if ids.count(i) > 1), None)) is not None:
        raise IntegrityError(f"{where}: task id {twice[:64]!r} appears twice; {FIX}")
    return doc


def check_eval_yaml(data: bytes, manifest, *, where: str = EVAL_YAML) -> dict:
    """``parse_eval_yaml`` + the tasks are exactly the ones this suite defines (ids, configs, split)."""
    doc = parse_eval_yaml(data, where=where)
    want = [{"id": t.id, "config": t.config, "split": SPLIT} for t in suite_tasks(manifest)]
    have = [{k: t[k] for k in ("id", "config", "split")} for t in doc["tasks"]]
    if doc["evaluation_framework"] != FRAMEWORK or have != want:
        raise IntegrityError(f"{where}: its tasks ({', '.join(t['id'][:40] for t in have)[:300]}) are not the ones "
                             f"suite {manifest.suite_id} defines ({', '.join(t['id'] for t in want)[:300]}); {FIX}")
    return doc
