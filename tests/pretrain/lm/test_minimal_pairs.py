"""pretrain/lm/minimal_pairs.py and python -m pretrain.minimal_pairs: BLiMP-format files read with one line per bad
row, accuracy per phenomenon and paradigm, and the command on a BERT and a GPT run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pretrain.lm import minimal_pairs
from pretrain.runtime.errors import UserError
from tests.helpers.commands import run_module

PAIRS = [
    {"sentence_good": "Thou art more lovely.", "sentence_bad": "Thou art lovely more.", "UID": "order",
     "linguistics_term": "word_order"},
    {"sentence_good": "The king is here.", "sentence_bad": "The king are here.", "UID": "agreement_1",
     "linguistics_term": "subject_verb_agreement"},
    {"sentence_good": "The kings are here.", "sentence_bad": "The kings is here.", "UID": "agreement_2",
     "linguistics_term": "subject_verb_agreement"},
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_accuracy_is_counted_per_phenomenon_per_paradigm_and_overall(tmp_path):
    pairs = minimal_pairs.read_pairs([write_jsonl(tmp_path / "blimp.jsonl", PAIRS)])
    summary = minimal_pairs.accuracies(pairs, np.array([-1.0, -2.0, -5.0]), np.array([-3.0, -1.0, -6.0]))
    assert summary["overall"] == {"pairs": 3, "accuracy": pytest.approx(2 / 3)}
    assert summary["phenomena"] == {"subject_verb_agreement": {"pairs": 2, "accuracy": 0.5},
                                    "word_order": {"pairs": 1, "accuracy": 1.0}}
    assert summary["paradigms"]["agreement_2"] == {"pairs": 1, "accuracy": 1.0}


def test_a_row_without_phenomenon_is_grouped_by_its_file(tmp_path):
    pairs = minimal_pairs.read_pairs([write_jsonl(tmp_path / "island_effects.jsonl", [
        {"sentence_good": "a", "sentence_bad": "b"}])])
    assert (pairs[0].phenomenon, pairs[0].paradigm) == ("island_effects", "island_effects")


@pytest.mark.parametrize("line, message", [
    ('{"sentence_good": "a", ', r"bad\.jsonl:2 is not JSON \(Expecting property name enclosed in double quotes at "
                                r"column \d+\): each line is one pair"),
    ('{"sentence_good": "a"}', r"bad\.jsonl:2 has no string sentence_good and sentence_bad"),
    ('["a", "b"]', r"bad\.jsonl:2 has no string sentence_good and sentence_bad"),
])
def test_a_malformed_row_is_one_line_naming_file_and_line(line, message, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [PAIRS[0], line])
    with pytest.raises(UserError, match=message):
        minimal_pairs.read_pairs([path])
    with pytest.raises(UserError, match="minimal-pair file not found: .*missing.jsonl"):
        minimal_pairs.read_pairs([str(tmp_path / "missing.jsonl")])


@pytest.mark.slow  # two commands, two training runs
def test_the_command_scores_a_bert_and_a_gpt_run(tiny_bert_workdir, tiny_gpt_workdir, tmp_path):
    write_jsonl(tmp_path / "blimp.jsonl", [{k: v.lower() if k.startswith("sentence") else v
                                                   for k, v in row.items()} for row in PAIRS])
    for workdir, extra in ((tiny_bert_workdir, ["--pll=within_word_l2r"]), (tiny_gpt_workdir, [])):
        output = tmp_path / "result.json"
        result = run_module("pretrain.minimal_pairs", [f"--workdir={workdir}", f"--data={tmp_path}",
                                                       f"--output={output}", *extra])
        summary = json.loads(output.read_text())
        assert summary["overall"]["pairs"] == 3 and set(summary["phenomena"]) == {"subject_verb_agreement",
                                                                                  "word_order"}
        last = result.stdout.strip().splitlines()[-1].split()
        assert last[:2] == ["overall", "3"] and float(last[2]) == pytest.approx(summary["overall"]["accuracy"],
                                                                                abs=1e-4)


@pytest.mark.slow  # a command
def test_the_command_refuses_a_malformed_file_before_loading_a_model(tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", ["not json"])
    result = run_module("pretrain.minimal_pairs", [f"--workdir={tmp_path / 'nothing'}", f"--data={data}"],
                        check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {data}:1 is not JSON (Expecting value at column 1): each line is one pair, a JSON object with "
        "sentence_good and sentence_bad"]
