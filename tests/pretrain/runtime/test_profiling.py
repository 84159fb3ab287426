"""config.profile_steps: the spec's checks (one line), and a real run's trace of the chosen steps."""
from __future__ import annotations

import glob
import pathlib

import pytest

from pretrain.runtime import profiling
from pretrain.runtime.errors import ConfigError
from tests.helpers.commands import run_train
from tests.helpers.tiny_bert import tiny_overrides


@pytest.mark.parametrize("spec, expected", [("", None), ("3,5", (3, 5)), ("4", (4, 4)), ("2,2", (2, 2))])
def test_profile_steps_spec_parses(spec, expected):
    assert profiling.parse_steps(spec) == expected


@pytest.mark.parametrize("spec", ["5,2", "0,3", "a,b", "3,"])
def test_bad_profile_steps_are_one_line_naming_the_key(spec):
    with pytest.raises(ConfigError, match=r"config.profile_steps=.*expected 'N,M' with 1 <= N <= M") as error:
        profiling.parse_steps(spec)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_profile_steps_write_a_trace_of_the_annotated_train_steps(tmp_path, corpus_and_tokenizer):
    workdir = tmp_path / "run"
    proc = run_train(workdir, tiny_overrides(*corpus_and_tokenizer, num_train_steps=4, profile_steps="2,3"))
    traces = glob.glob(str(workdir / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1, traces
    trace = pathlib.Path(traces[0]).read_bytes()
    assert b"step_num" in trace and b"train_step" in trace  # the steps' annotation and the compiled step
    assert "Profile of steps 2..3 written to" in proc.stdout
