"""pretrain/tools/export_hf_bert.py: a run of another family is refused in one line, before any weight is read."""
from __future__ import annotations

import os

import pytest

from configs import glue, gpt2, t5
from pretrain.core.errors import UserError
from pretrain.tools import export_hf_bert


@pytest.mark.parametrize("family, config", [
    ("gpt", lambda: gpt2.get_config()),                      # pretraining runs: used to complain about a field
    ("t5", lambda: t5.get_config()),
    ("t5", lambda: glue.get_config("task=mrpc,model=t5")),   # fine-tuning runs
    ("gpt", lambda: glue.get_config("task=sst2,model=gpt")),
])
def test_a_gpt_or_t5_run_is_refused_naming_its_family(family, config, tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config().to_json())
    with pytest.raises(UserError) as info:
        export_hf_bert.export(str(workdir), str(tmp_path / "out"))
    assert str(info.value) == (f"pretrain.tools.export_hf_bert exports BERT runs only, and {workdir} holds a "
                               f"{family} model")
    assert not os.path.exists(tmp_path / "out")
