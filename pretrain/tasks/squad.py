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

from pretrain.data.sources import as_text
from pretrain.runtime.errors import UserError
from pretrain.tasks.base import data_location
from pretrain.workdir import storage


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


TFDS_NAMES = {"squad": "squad/v1.1", "squad_v2": "squad/v2.0"}
TFDS_SPLITS = {"train": "train", "dev": "validation"}


def read_squad_tfds(task: str, split: str, data_dir: str = "") -> list[QaExample]:
    """TFDS `squad/v1.1` or `squad/v2.0` (array_record, no TensorFlow needed) as the same examples. Prepares the
    dataset first where `data_dir` lacks it (which downloads: needs the network)."""
    import tensorflow_datasets as tfds  # optional dependency: import only when used
    import tensorflow_datasets.question_answering.squad  # noqa: F401  registers the builder

    name = TFDS_NAMES[task]
    try:
        source = tfds.data_source(name, split=TFDS_SPLITS[split], data_dir=data_dir or None,
                                  builder_kwargs={"file_format": "array_record"})
    except OSError as e:
        raise SquadDataError(f"TFDS dataset {name} is not prepared under {data_dir or '~/tensorflow_datasets'} and "
                             f"downloading it failed ({type(e).__name__}); prepare it where there is network, or set "
                             "--config.data.source=dir and --config.data.dir to the SQuAD files") from None
    examples = _from_features(source.__getitems__(list(range(len(source)))))
    if not examples:
        raise SquadDataError(f"TFDS {name} {TFDS_SPLITS[split]} has no questions")
    return sorted(examples, key=lambda e: e.id)  # array_record's order is a hash; ids give a fixed one


def read_squad_hub(split: str, path: str) -> list[QaExample]:
    """The Hugging Face Hub's SQuAD (`rajpurkar/squad`, `rajpurkar/squad_v2`, or a local copy of a repository in
    their layout: id, title, context, question, answers {text, answer_start}), in the files' order."""
    from pretrain.data import hub
    try:
        dataset = hub.load(path, split=TFDS_SPLITS[split], flags=hub.Flags.of_task())
    except hub.CorpusError as e:
        raise SquadDataError(str(e)) from None
    missing = [key for key in ("id", "question", "context", "answers") if key not in dataset.features]
    if missing:
        raise SquadDataError(f"the dataset {path!r} has no column {missing[0]!r} (its columns are "
                             f"{list(dataset.features)}; SQuAD's layout is id, question, context, answers)")
    examples = _from_features(dataset)
    if not examples:
        raise SquadDataError(f"the dataset {path!r} split {TFDS_SPLITS[split]!r} has no questions")
    return examples


def _from_features(records) -> list[QaExample]:
    """Examples from records with SQuAD's features (TFDS's and the Hub's: bytes or str)."""
    return [QaExample(as_text(ex["id"]), as_text(ex["question"]), as_text(ex["context"]),
                      tuple(Answer(as_text(t), int(s)) for t, s in zip(ex["answers"]["text"],
                                                                     ex["answers"]["answer_start"])))
            for ex in records]


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


# ----------------------------------------------------------------------------------------------
# The task, as the fine-tuning loop sees it (pretrain/tasks/base.py).

SPLIT_FILES = {"squad": {"train": "train-v1.1.json", "dev": "dev-v1.1.json"},
               "squad_v2": {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}}
NAMES = tuple(SPLIT_FILES)


@dataclasses.dataclass(frozen=True)
class Prediction:
    text: str          # the best non-empty span's text ('' when no span was possible)
    null_margin: float  # no-answer score - the best span's score: v2.0 answers '' where it exceeds the threshold

    def answer(self, threshold: float) -> str:
        return "" if self.null_margin > threshold else self.text


@dataclasses.dataclass(frozen=True)
class SquadTask:
    """Extractive QA on SQuAD's JSON files under `data_dir`, scored by the official script's exact match and F1
    (x100). v2.0 answers '' where the no-answer score beats the best span by more than `null_threshold`; its
    scores also report the best threshold on the split (the official v2.0 script's best_f1_thresh)."""
    name: str
    data_dir: str              # the JSON files (source dir), or TFDS's data_dir ('' = its default)
    null_threshold: float = 0.0
    source: str = "dir"        # dir | tfds
    kind = "qa"
    main_metric = "f1"
    dev_splits = ("dev",)
    test_splits = ()
    settings = {}

    @classmethod
    def from_config(cls, config) -> SquadTask:
        d = config.data
        location = data_location(d, config.task, ", ".join(SPLIT_FILES[config.task].values()), TFDS_NAMES[config.task],
                                 SquadDataError, hub_name=f"rajpurkar/{config.task}")
        return cls(config.task, location, d.get("null_threshold", 0.0), d.source)

    @property
    def version_2(self) -> bool:
        return self.name == "squad_v2"

    def labelled(self, split: str) -> bool:
        return True

    def load(self, config, split: str, options=None) -> list[QaExample]:
        files = SPLIT_FILES[self.name]
        if split not in files:
            raise SquadDataError(f"task {self.name} has no split {split!r}; use one of {', '.join(files)}")
        if self.source == "tfds":
            return read_squad_tfds(self.name, split, self.data_dir)
        if self.source == "hf":
            return read_squad_hub(split, self.data_dir)
        return read_squad(os.path.join(self.data_dir, files[split]))

    def score(self, finetuner, predictions: list[Prediction], examples: list[QaExample]) -> dict[str, float]:
        answers = {e.id: p.answer(self.null_threshold) for e, p in zip(examples, predictions)}
        scores = squad_scores(examples, answers)
        if self.version_2:
            scores.update(best_threshold(examples, predictions))
        return scores

    def write_predictions(self, directory: str, split: str, finetuner, predictions: list[Prediction],
                          examples: list[QaExample]) -> str:
        """{question id: answer}, the official script's predictions file."""
        path = os.path.join(directory, f"{split}.json")
        answers = {e.id: p.answer(self.null_threshold) for e, p in zip(examples, predictions)}
        storage.write_atomic(path, json.dumps(answers, indent=1, ensure_ascii=False))
        return path


def best_threshold(examples: list[QaExample], predictions: list[Prediction]) -> dict[str, float]:
    """The no-answer threshold with the best F1 on these examples: {'best_f1', 'best_f1_threshold'}. Each
    prediction's margin is a candidate, as in the official v2.0 script's find_best_thresh (in one sorted pass)."""
    def best_f1(answer: str, example: QaExample) -> float:
        return max(f1(answer, g) for g in ([a.text for a in example.answers] or [""]))
    if_span = [best_f1(p.text, e) for e, p in zip(examples, predictions)]
    if_empty = [best_f1("", e) for e in examples]
    order = sorted(range(len(examples)), key=lambda i: predictions[i].null_margin)
    total = sum(if_empty)  # a threshold below every margin: every answer is ''
    best = (total, min((p.null_margin for p in predictions), default=0.0) - 1.0)
    for rank, i in enumerate(order):  # a threshold at this margin answers this question (and ties) with its span
        total += if_span[i] - if_empty[i]
        margin = predictions[i].null_margin
        if rank + 1 == len(order) or predictions[order[rank + 1]].null_margin != margin:
            best = max(best, (total, margin))
    return {"best_f1": 100.0 * best[0] / len(examples), "best_f1_threshold": best[1]}
