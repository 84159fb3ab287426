"""Fine-tuning head kinds: one module each, one registration below, and the only list of them.

A head kind (base.HeadKind) says what differs per kind of task output: the head module, its loss, metrics
and predictions, the batch keys its model reads and the transformers class it exports as. Its readers look
it up in HEAD_KINDS (a models/registry.py `Registry`) through `head_kind`: FineTuningObjective (objective.py),
BertForFineTuning (models/bert_tasks.py, given the kind), the finetuners (pretrain/finetuners/: each names the
kinds it fine-tunes), the tasks (pretrain/tasks/: each names its kind) and the exporter
(pretrain/tools/export_hf_bert.py). Adding a kind is its module plus one `HEAD_KINDS.register` line; entries are
"module:attribute" strings, imported on first use (as models/families.py's are).
"""
from __future__ import annotations

from models.registry import Registry
from objectives.interface import ObjectiveError
from objectives.task_heads.base import HeadKind

HEAD_KINDS: Registry[HeadKind] = Registry("fine-tuning task kind", error=ObjectiveError)


def head_kind(name: str) -> HeadKind:
    """A head kind by name, or ObjectiveError naming the known ones."""
    kind = HEAD_KINDS.get(name)
    if kind.name != name:  # a registration naming another kind's object: the name is what the tasks write
        raise ValueError(f"head kind {name!r} is registered as {kind!r}, whose name is {kind.name!r}")
    return kind


HEAD_KINDS.register("classification", "objectives.task_heads.classification:CLASSIFICATION")
HEAD_KINDS.register("regression", "objectives.task_heads.regression:REGRESSION")
HEAD_KINDS.register("tagging", "objectives.task_heads.tagging:TAGGING")
HEAD_KINDS.register("span", "objectives.task_heads.span:SPAN")
HEAD_KINDS.register("qa", "objectives.task_heads.qa:QA")
