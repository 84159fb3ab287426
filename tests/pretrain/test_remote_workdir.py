"""A URL as --workdir is refused in one line instead of becoming a local folder named 'gs:'."""
from __future__ import annotations

import os

import pytest

from pretrain.core import workdir
from pretrain.core.errors import UserError


def test_a_gs_workdir_is_a_one_line_error_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="gcsfuse"):
        workdir.prepare("gs://bucket/run")
    assert not os.path.exists(tmp_path / "gs:")
    assert workdir.prepare(str(tmp_path / "local")) == str(tmp_path / "local")  # a local path still works
