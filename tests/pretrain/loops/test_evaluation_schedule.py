"""pretrain/loops/pretraining.py's evaluators: periodic evaluation of a corpus that held no text out is said once,
not silently skipped."""
from __future__ import annotations

import ml_collections

from pretrain.loops import pretraining


def test_periodic_evaluation_without_held_out_text_is_warned_once(capsys):
    config = ml_collections.ConfigDict({"eval_every": 137})
    for _ in range(2):  # a run builds its evaluators once, validation may run twice: one line all the same
        assert pretraining._evaluators(config, {}, trainer=None, writer=None) is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: config.eval_every=137 evaluates nothing"), lines
    assert "--config.data.eval_documents=K" in lines[0] and "--config.eval_every=0" in lines[0]


def test_no_periodic_evaluation_asked_is_no_warning(capsys):
    assert pretraining._evaluators(ml_collections.ConfigDict({"eval_every": 0}), {}, None, None) is None
    assert capsys.readouterr().err == ""
