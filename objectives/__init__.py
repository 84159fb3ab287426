"""Objectives, built by name from `config.objective`. Each owns its batch construction and loss."""
from __future__ import annotations

import ml_collections


def build_objective(config: ml_collections.ConfigDict, tokenizer):
    if config.name == "bert_pretraining":
        from objectives.bert_pretraining import BertPretraining
        return BertPretraining(config, tokenizer)
    raise ValueError(f"config.objective.name={config.name!r} is unknown; available: 'bert_pretraining'")
