"""The pretraining objectives: one registration each, and the only list of them.

config.objective.name names the objective; OBJECTIVES (a models/registry.py `Registry`) maps it to the class,
built as Class(config.objective, tokenizer) (objectives/interface.py's Objective). Readers: `build_objective` (the
pretraining loop, the trainer set-up, the benchmarks) and `names` (config validation). Adding an objective is
its module plus one `OBJECTIVES.register` line; entries are 'module:Class' strings, imported on first use (as
models/families.py's are).
"""
from __future__ import annotations

from models.registry import Registry
from objectives.interface import Objective, ObjectiveError

OBJECTIVES: Registry[type[Objective]] = Registry("objective", key="config.objective.name", error=ObjectiveError)


def names() -> tuple[str, ...]:
    return OBJECTIVES.names()


def build_objective(config, tokenizer) -> Objective:
    """config.objective (its `name` and settings) + the run's tokenizer -> the objective."""
    return OBJECTIVES.get(config.name)(config, tokenizer)


OBJECTIVES.register("bert_pretraining", "objectives.bert_pretraining:BertPretraining")  # MLM + NSP / SOP
OBJECTIVES.register("spanbert", "objectives.bert_pretraining:SpanBertPretraining")  # span masking + SBO
OBJECTIVES.register("electra", "objectives.electra:ElectraPretraining")  # replaced token detection
OBJECTIVES.register("span_corruption", "objectives.denoising:EncoderDecoderDenoising")  # T5's default mode
# mode: span_corruption | prefix_lm | iid
OBJECTIVES.register("encoder_decoder_denoising", "objectives.denoising:EncoderDecoderDenoising")
OBJECTIVES.register("causal_lm", "objectives.causal_lm:CausalLM")  # GPT
# decoder-only; T5's is encoder_decoder_denoising with mode=prefix_lm
OBJECTIVES.register("prefix_lm", "objectives.prefix_lm:PrefixLM")
OBJECTIVES.register("distillation", "objectives.distillation.objective:Distillation")  # DistilBERT, model 'distil'
