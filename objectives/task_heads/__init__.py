"""Fine-tuning head kinds: one module each, one registration below, and the only list of them.

A head kind (base.HeadKind) says what differs per kind of task output: the head module, its loss, metrics
and predictions, the batch keys its model reads and the transformers class it exports as. Its readers look
it up here: FineTuningObjective (objective.py), BertForFineTuning (models/bert_tasks.py, given the kind),
the finetuners (pretrain/finetuners/), the tasks (pretrain/tasks/: each names its kind) and the exporter
(pretrain/tools/export_hf_bert.py). Adding a kind is its module plus one `register` line; names are
"module:attribute" strings, imported on first use (as models/families.py does for model families).
"""
from __future__ import annotations

from models.registry import resolve
from objectives.interface import ObjectiveError
from objectives.task_heads.base import HeadKind

HEAD_KINDS: dict[str, str] = {}  # name -> 'module:attribute' of its HeadKind, in registration order


def register(name: str, target: str) -> None:
    if name in HEAD_KINDS:
        raise ValueError(f"head kind {name!r} is registered twice")
    HEAD_KINDS[name] = target


def head_kind(name: str) -> HeadKind:
    """A head kind by name, or ObjectiveError naming the known ones."""
    if name not in HEAD_KINDS:
        raise ObjectiveError(f"unknown fine-tuning task kind {name!r} (use one of {', '.join(HEAD_KINDS)})")
    kind = resolve(HEAD_KINDS[name])
    if kind.name != name:
        raise ValueError(f"head kind {name!r} is registered as {HEAD_KINDS[name]}, whose name is {kind.name!r}")
    return kind


register("classification", "objectives.task_heads.classification:CLASSIFICATION")
register("regression", "objectives.task_heads.regression:REGRESSION")
register("tagging", "objectives.task_heads.tagging:TAGGING")
register("span", "objectives.task_heads.span:SPAN")
register("qa", "objectives.task_heads.qa:QA")
