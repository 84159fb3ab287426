"""The pretraining objectives: one registration each, and the only list of them.

config.objective.name names the objective; its registration names the class, built as
Class(config.objective, tokenizer) (objectives/interface.py's Objective). Readers: `build_objective` (the
pretraining loop, the trainer set-up, the benchmarks) and `names` (config validation). Adding an objective is
its module plus one `register` line; names are 'module:Class' strings, imported on first use (as
models/families.py does for model families).
"""
from __future__ import annotations

import dataclasses

from models.registry import resolve
from objectives.interface import Objective, ObjectiveError


@dataclasses.dataclass(frozen=True)
class ObjectiveEntry:
    name: str       # config.objective.name
    target: str     # 'module:Class', called as Class(config.objective, tokenizer)
    note: str = ""  # what it is, for the reader of this table


OBJECTIVES: dict[str, ObjectiveEntry] = {}  # name -> its entry, in registration order


def register(entry: ObjectiveEntry) -> ObjectiveEntry:
    if entry.name in OBJECTIVES:
        raise ValueError(f"objective {entry.name!r} is registered twice")
    OBJECTIVES[entry.name] = entry
    return entry


def names() -> tuple[str, ...]:
    return tuple(OBJECTIVES)


def build_objective(config, tokenizer) -> Objective:
    """config.objective (its `name` and settings) + the run's tokenizer -> the objective."""
    if config.name not in OBJECTIVES:
        raise ObjectiveError(f"config.objective.name={config.name!r} is unknown; available: {', '.join(OBJECTIVES)}")
    return resolve(OBJECTIVES[config.name].target)(config, tokenizer)


register(ObjectiveEntry("bert_pretraining", "objectives.bert_pretraining:BertPretraining", "MLM + NSP / SOP"))
register(ObjectiveEntry("spanbert", "objectives.bert_pretraining:SpanBertPretraining", "span masking + SBO"))
register(ObjectiveEntry("electra", "objectives.electra:ElectraPretraining", "replaced token detection"))
register(ObjectiveEntry("span_corruption", "objectives.denoising:EncoderDecoderDenoising", "T5's default mode"))
register(ObjectiveEntry("encoder_decoder_denoising", "objectives.denoising:EncoderDecoderDenoising",
                        "mode: span_corruption | prefix_lm | iid"))
register(ObjectiveEntry("causal_lm", "objectives.causal_lm:CausalLM", "GPT"))
register(ObjectiveEntry("prefix_lm", "objectives.prefix_lm:PrefixLM",
                        "decoder-only; T5's is encoder_decoder_denoising with mode=prefix_lm"))
register(ObjectiveEntry("distillation", "objectives.distillation.objective:Distillation", "DistilBERT, model 'distil'"))
