"""pretrain/loops/evaluation.py: what pretrain.evaluate refuses before it restores or writes anything."""
from __future__ import annotations

import os

import pytest

from configs import glue
from pretrain.loops import evaluation
from pretrain.runtime.errors import UserError


@pytest.mark.parametrize("splits", [[], [""], [" ", ""]])
def test_an_empty_splits_flag_is_refused_and_eval_results_json_is_kept(splits, tmp_path):
    """`--splits=` used to score nothing and overwrite eval_results.json with empty metrics."""
    (tmp_path / "config.json").write_text(glue.get_config("task=mrpc").to_json())
    kept = '{"task": "mrpc", "metrics": {"dev": {"accuracy": 0.8}}}'
    (tmp_path / "eval_results.json").write_text(kept)
    with pytest.raises(UserError, match=r"^--splits is empty: .*of mrpc to score \(dev, test or one of dev, test\)"):
        evaluation.evaluate_workdir(str(tmp_path), splits)
    assert (tmp_path / "eval_results.json").read_text() == kept
    assert sorted(os.listdir(tmp_path)) == ["config.json", "eval_results.json"]
