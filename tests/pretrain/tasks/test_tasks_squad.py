"""SQuAD files and the official metric: normalisation edge cases checked by hand, v2.0's unanswerable
questions, and the one-line errors that name the file, the line and the question."""
from __future__ import annotations

import json

import pytest

from pretrain.tasks import squad

CONTEXT = "The Eiffel Tower, built in 1889, stands in Paris."


def squad_file(tmp_path, qas: list[dict], name: str = "dev-v1.1.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": CONTEXT, "qas": qas}]}]}, indent=1))
    return str(path)


QAS = [{"id": "q1", "question": "When was it built?", "answers": [{"text": "1889", "answer_start": 27}]},
       {"id": "q2", "question": "What stands in Paris?",
        "answers": [{"text": "The Eiffel Tower", "answer_start": 0}, {"text": "Eiffel Tower", "answer_start": 4}]},
       {"id": "q3", "question": "Who painted it?", "answers": [], "is_impossible": True}]


def test_read_squad_flattens_questions_with_checked_answers(tmp_path):
    examples = squad.read_squad(squad_file(tmp_path, QAS))
    assert [e.id for e in examples] == ["q1", "q2", "q3"]
    assert examples[1].answers[1] == squad.Answer("Eiffel Tower", 4) and examples[2].answers == ()
    assert examples[0].context == CONTEXT


def test_answer_start_that_misses_the_answer_names_file_line_and_question(tmp_path):
    qas = QAS[:1] + [{"id": "bad", "question": "?", "answers": [{"text": "Paris", "answer_start": 3}]}]
    path = squad_file(tmp_path, qas)
    with open(path) as f:
        line = next(i for i, text in enumerate(f, start=1) if '"bad"' in text)
    with pytest.raises(squad.SquadDataError, match=rf"dev-v1\.1\.json:{line}: question bad: answer_start 3 "
                                                   r"points at ' Eiff', not the answer 'Paris'"):
        squad.read_squad(path)


def test_empty_or_malformed_squad_file_is_one_line(tmp_path):
    with pytest.raises(squad.SquadDataError, match="has no questions"):
        squad.read_squad(squad_file(tmp_path, []))
    broken = tmp_path / "train-v1.1.json"
    broken.write_text('{"data": [')
    with pytest.raises(squad.SquadDataError, match="not a SQuAD file"):
        squad.read_squad(str(broken))
    with pytest.raises(squad.SquadDataError, match="SQuAD file not found"):
        squad.read_squad(str(tmp_path / "dev-v2.0.json"))


@pytest.mark.parametrize("prediction, gold, em, f1", [
    ("the Eiffel Tower!", "Eiffel Tower", 1.0, 1.0),         # articles and punctuation removed
    ("An  EIFFEL tower", "the eiffel tower", 1.0, 1.0),      # case, "an", runs of spaces
    ("a big red dog", "red dog", 0.0, 0.8),                  # P 2/3, R 1 -> 0.8
    ("red red dog", "red dog dog", 0.0, 2 / 3),              # token counts, not sets: common = 2
    ("in 1889,", "1889", 0.0, 2 / 3),                         # P 1/2, R 1
    ("the", "", 1.0, 1.0),                                    # both normalise to nothing (v2.0's rule)
    ("Paris", "", 0.0, 0.0),                                  # an answer to an unanswerable question
    ("don't", "dont", 1.0, 1.0),                              # the apostrophe is punctuation
])
def test_official_metric_on_hand_checked_cases(prediction, gold, em, f1):
    assert squad.exact_match(prediction, gold) == em
    assert squad.f1(prediction, gold) == pytest.approx(f1)


def test_squad_scores_take_the_best_gold_answer_and_count_missing_predictions(tmp_path):
    examples = squad.read_squad(squad_file(tmp_path, QAS))
    scores = squad.squad_scores(examples, {"q1": "in 1889", "q2": "Eiffel Tower", "q3": ""})
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)          # q1 misses EM; q2 and q3 match
    assert scores["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1) / 3)     # q1: P 1/2, R 1
    missing = squad.squad_scores(examples, {"q2": "Eiffel Tower"})
    assert missing == pytest.approx({"exact_match": 100 / 3, "f1": 100 / 3})
