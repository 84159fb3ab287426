"""ModernBERT through the pretraining loop, in process: MLM at 30% masking on packed rows (segment ids and positions
inside each example) trains, saves, stops on a preemption request and resumes to the parameters of an uninterrupted
run, bit for bit."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pretrain.workdir import preemption
from tests.helpers.states import assert_same_states
from tests.helpers.tiny_bert import tiny_config

SPEC = "configs/modernbert.py:size=tiny,packing=True"


def modernbert_config(corpus: str, spm: str, **extra):
    # 3 layers: layer 0 global, layers 1 and 2 within a window of 8 tokens either side of a 32-token row
    return tiny_config(corpus, spm, SPEC, **{"model.local_attention": 16, "objective.max_predictions_per_seq": 10,
                                             **extra})


def test_modernbert_pretrains_on_packed_rows_and_learns(tmp_path, corpus_and_tokenizer):
    from pretrain.loops import pretraining
    config = modernbert_config(*corpus_and_tokenizer, num_train_steps=12, checkpoint_every=12,
                               **{"optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 2})
    pretraining.train_and_evaluate(config, str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["mlm_loss"] for r in records if "mlm_loss" in r]
    assert len(losses) == 12 and np.mean(losses[-3:]) < losses[0] - 0.25, losses  # from log(1000) = 6.9 down
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"]["name"] == "modernbert" and saved["objective"]["mask_prob"] == 0.3


def test_modernbert_preempted_then_resumed_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path, corpus_and_tokenizer,
                                                                                     monkeypatch):
    from pretrain.loops import pretraining
    config = modernbert_config(*corpus_and_tokenizer, num_train_steps=6, checkpoint_every=3)
    stopped = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 4)
        with pytest.raises(preemption.Preempted) as info:
            pretraining.train_and_evaluate(config, str(stopped))
    assert info.value.step == 4 and sorted(os.listdir(stopped / "checkpoints")) == ["3", "4"]
    pretraining.train_and_evaluate(config, str(stopped))
    reference = tmp_path / "uninterrupted"
    pretraining.train_and_evaluate(config, str(reference))
    assert_same_states(reference / "checkpoints" / "6", stopped / "checkpoints" / "6")
