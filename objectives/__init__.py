"""Objectives, built by name from `config.objective`. Each owns its batch construction and loss and
implements objectives.interface.Objective."""
from __future__ import annotations

import ml_collections

from objectives.interface import Objective, ObjectiveError

NAMES = ("bert_pretraining", "spanbert", "electra", "span_corruption", "encoder_decoder_denoising", "causal_lm",
         "prefix_lm", "distillation")


def build_objective(config: ml_collections.ConfigDict, tokenizer) -> Objective:
    if config.name == "bert_pretraining":
        from objectives.bert_pretraining import BertPretraining
        return BertPretraining(config, tokenizer)
    if config.name == "spanbert":
        from objectives.bert_pretraining import SpanBertPretraining
        return SpanBertPretraining(config, tokenizer)
    if config.name == "electra":
        from objectives.electra import ElectraPretraining
        return ElectraPretraining(config, tokenizer)
    if config.name in ("span_corruption", "encoder_decoder_denoising"):  # mode: span_corruption | prefix_lm | iid
        from objectives.denoising import EncoderDecoderDenoising
        return EncoderDecoderDenoising(config, tokenizer)
    if config.name == "causal_lm":
        from objectives.causal_lm import CausalLM
        return CausalLM(config, tokenizer)
    if config.name == "prefix_lm":  # decoder-only; T5's is encoder_decoder_denoising with mode=prefix_lm
        from objectives.prefix_lm import PrefixLM
        return PrefixLM(config, tokenizer)
    if config.name == "distillation":  # DistilBERT, with model 'distil'
        from objectives.distillation.objective import Distillation
        return Distillation(config, tokenizer)
    raise ObjectiveError(f"config.objective.name={config.name!r} is unknown; available: {', '.join(NAMES)}")
