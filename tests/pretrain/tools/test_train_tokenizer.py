"""pretrain.tools.train_tokenizer as a command: bad input is one line and exit status 2."""
from __future__ import annotations

import re

import pytest

from pretrain.tools import train_tokenizer


@pytest.fixture
def text(tmp_path) -> str:
    path = tmp_path / "text.txt"
    path.write_text("".join(f"the quick brown fox {i} jumps over the lazy dog {i * 7}\n" for i in range(200)))
    return str(path)


def test_a_vocabulary_larger_than_the_text_allows_is_one_line_naming_the_maximum(text, tmp_path, capsys):
    """Before: sentencepiece's message at the end of a traceback ("INTERNAL: src/trainer_interface.cc(744)
    ... Vocabulary size too high (32000). Please set it to a value <= N.")."""
    prefix = str(tmp_path / "out" / "spm")
    with pytest.raises(SystemExit) as e:
        train_tokenizer.main(["--input", text, "--model_prefix", prefix, "--vocab_size", "32000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --vocab_size 32000 "), err
    assert "Traceback" not in err and "trainer_interface" not in err, err
    most = int(re.search(r"maximum of (\d+)", err).group(1))
    assert f"use --vocab_size {most} or less" in err and text in err, err
    # The maximum it names is one that works.
    assert train_tokenizer.main(["--input", text, "--model_prefix", prefix, "--vocab_size", str(most)]) == 0
    assert capsys.readouterr().out.strip() == prefix + ".model"


def test_a_missing_input_is_one_line(tmp_path, capsys):
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(SystemExit) as e:
        train_tokenizer.main(["--input", missing, "--model_prefix", str(tmp_path / "spm")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: tokenizer training file not found: {missing} (check --input)\n"
