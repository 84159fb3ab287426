"""SQuAD-style extractive question answering: the official JSON files (v1.1 and v2.0) and the official metric.

`read_squad` flattens `data[].paragraphs[].qas[]` into examples and checks every answer against its context
(the text at `answer_start` must be the answer's text). `squad_scores` is the official evaluation script's
arithmetic (v1.1's `evaluate-v1.1.py`, which v2.0's script extends to unanswerable questions): answers are
normalised (lower case, punctuation and the articles a / an / the removed, whitespace collapsed), a prediction
scores the best exact match and the best token-level F1 over the gold answers, and an unanswerable question
(no gold answer) scores 1 exactly when the prediction is empty.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import string

from pretrain.core.errors import UserError


class SquadDataError(UserError):
    """A SQuAD file that cannot be used (one line naming the file, the line and the fix)."""


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset into the context


@dataclasses.dataclass(frozen=True)
class QaExample:
    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # empty: unanswerable (v2.0)


def read_squad(path: str) -> list[QaExample]:
    """Every question of a SQuAD v1.1 / v2.0 JSON file, answers checked against their contexts."""
    if not os.path.exists(path):
        raise SquadDataError(f"SQuAD file not found: {path} (give --config.data.dir the folder with "
                             "train-v1.1.json and dev-v1.1.json, or the v2.0 files)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        articles = json.loads(text)["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SquadDataError(f"{path}: not a SQuAD file ({e}); expected {{\"data\": [{{\"paragraphs\": "
                             "[{\"context\": ..., \"qas\": [...]}]}]}") from None
    examples = [_example(path, text, paragraph["context"], qa)
                for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    if not examples:
        raise SquadDataError(f"{path} has no questions: its data[].paragraphs[].qas[] lists are empty")
    return examples


def _example(path: str, text: str, context: str, qa: dict) -> QaExample:
    answers = tuple(Answer(a["text"], int(a["answer_start"])) for a in qa.get("answers", []))
    for answer in answers:
        found = context[answer.start:answer.start + len(answer.text)]
        if found != answer.text:
            raise SquadDataError(f"{path}:{_line_of(text, qa['id'])}: question {qa['id']}: answer_start "
                                 f"{answer.start} points at {found!r}, not the answer {answer.text!r} (fix "
                                 "answer_start or the answer text)")
    return QaExample(qa["id"], qa["question"], context, answers)


def _line_of(text: str, question_id: str) -> int:
    """The 1-based line of the question's id in the file's text (0 if it cannot be found)."""
    at = text.find(json.dumps(question_id))
    return text.count("\n", 0, at) + 1 if at >= 0 else 0


def normalize_answer(s: str) -> str:
    """The official script's normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings; two empty strings agree (v2.0's no-answer)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_scores(examples: list[QaExample], predictions: dict[str, str]) -> dict[str, float]:
    """{'exact_match', 'f1'} x100 over every example, as the official script prints them; a question with no
    prediction scores 0 (the script warns and counts it)."""
    if not examples:
        raise ValueError("squad_scores: no examples to score")
    em = f1_total = 0.0
    for example in examples:
        golds = [a.text for a in example.answers] or [""]  # unanswerable: only the empty answer is right
        predicted = predictions.get(example.id)
        if predicted is None:
            continue
        em += max(exact_match(predicted, g) for g in golds)
        f1_total += max(f1(predicted, g) for g in golds)
    return {"exact_match": 100.0 * em / len(examples), "f1": 100.0 * f1_total / len(examples)}
