"""Few-shot prompting (pretrain/lm/fewshot.py, pretrain/tasks/glue/prompts.py): the prompt format of the polarity
example of Xiao & Zhu 2025 (Foundations of Large Language Models, Section 1.1.2), the demonstration sampler,
candidate scores against transformers' GPT2LMHeadModel, a planted scorer through the metric path, the
context-overflow rule, user errors and the command."""
from __future__ import annotations

import collections
import json
import os
import string
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from models.convert.hf_gpt2 import gpt_config_to_hf, hf_state_dict_from_gpt
from models.gpt import GPT, GPTConfig
from pretrain.data.tokenizers import CharTokenizer
from pretrain.lm import fewshot
from pretrain.lm.language_model import LanguageModel
from pretrain.runtime.errors import UserError
from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue import prompts
from pretrain.tasks.glue.data import Example
from tests.helpers.commands import run_module, subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.random_weights import gpt_random_params

SST2 = ("Assume that the polarity of a text is a label chosen from {negative, positive}. "
        "Identify the polarity of the input.")
SENTENCES = ["a gorgeous , witty film .", "dull and lifeless .", "the acting is superb .", "a waste of time .",
             "it 's a charming journey .", "painfully slow .", "a moving story .", "flat jokes , flat plot ."]
TRAIN = [Example(s, None, 1 - i % 2, i) for i, s in enumerate(SENTENCES)]  # positive, negative, ...
DEV = [Example("i love the food here .", None, 1, 0), Example("the traffic is terrible .", None, 0, 1),
       Example("the weather here is wonderful .", None, 1, 2), Example("a tedious mess .", None, 0, 3),
       Example("gorgeous and witty .", None, 1, 4)]


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory) -> CharTokenizer:
    path = tmp_path_factory.mktemp("vocab") / "printable.txt"
    path.write_text(string.printable)
    return CharTokenizer(str(path))


# ----------------------------------------------------------------------------------------------
# The prompt text.


def test_prompt_is_instruction_demonstrations_then_query():
    """Xiao & Zhu's polarity example: the task description naming the label set, demonstrations as 'Input: x' +
    'Polarity: label', the query ending in the output indicator; blocks separated by a blank line."""
    fmt = prompts.prompt_format("sst2")
    text = prompts.build_prompt(fmt, [TRAIN[1], TRAIN[0]], Example(" i love the food here . ", None, 1, 7))
    assert text == (SST2 + "\n\n"
                    "Input: dull and lifeless .\nPolarity: negative\n\n"
                    "Input: a gorgeous , witty film .\nPolarity: positive\n\n"
                    "Input: i love the food here .\nPolarity:")
    assert prompts.completions(fmt) == [" negative", " positive"]
    assert prompts.build_prompt(fmt, [], DEV[1]) == SST2 + "\n\nInput: the traffic is terrible .\nPolarity:"


def test_pair_prompt_has_two_indicated_inputs():
    fmt = prompts.prompt_format("MRPC")
    demo = Example("He left.", "He went away.", 1, 0)
    query = Example("It rained.", "The sun shone.", 0, 1)
    assert prompts.build_prompt(fmt, [demo], query) == (
        "Assume that whether two sentences are paraphrases is a label chosen from {no, yes}. Identify whether the "
        "input sentences are paraphrases.\n\n"
        "Sentence 1: He left.\nSentence 2: He went away.\nParaphrase: yes\n\n"
        "Sentence 1: It rained.\nSentence 2: The sun shone.\nParaphrase:")
    # MNLI's three classes in GLUE order (entailment, neutral, contradiction); --label_words replaces them
    assert prompts.prompt_format("mnli").label_words == ("yes", "maybe", "no")
    custom = prompts.prompt_format("sst2", ["bad", "good"])
    assert prompts.instruction_text(custom).startswith("Assume that the polarity of a text is a label chosen from "
                                                       "{bad, good}.")
    assert prompts.demonstration_text(custom, TRAIN[0]).endswith("\nPolarity: good")


def test_every_classification_task_has_a_format():
    for task in glue.TASKS.values():
        if task.is_regression:
            continue
        fmt = prompts.prompt_format(task)
        assert len(fmt.label_words) == task.num_labels and len(set(fmt.label_words)) == task.num_labels
        assert len(fmt.input_indicators) == (2 if task.is_pair else 1), task.name
        assert "{" + ", ".join(fmt.label_words) + "}" in prompts.instruction_text(fmt)


# ----------------------------------------------------------------------------------------------
# Demonstrations.


def _pool(n: int = 40) -> list[Example]:
    return [Example(f"train sentence {i}", None, int(i % 4 == 0), i) for i in range(n)]  # a quarter positive


def test_sampler_never_draws_the_evaluated_example_and_is_seed_deterministic():
    pool = _pool()
    pool[7] = Example("the test sentence", None, 1, 7)  # the evaluated example's text, twice in train
    pool[23] = Example("the test sentence", None, 0, 23)
    evaluated = Example("the test sentence", None, 1, 5)
    for balanced in (False, True):
        sampler = prompts.DemonstrationSampler(pool, 8, seed=3, num_labels=2, balanced=balanced)
        for idx in range(300):
            demos = sampler.sample(Example("the test sentence", None, 1, idx))
            assert len(demos) == 8 and len({d.idx for d in demos}) == 8
            assert all(d.text_a != "the test sentence" for d in demos)
        again = prompts.DemonstrationSampler(pool, 8, seed=3, num_labels=2, balanced=balanced)
        assert sampler.sample(evaluated) == again.sample(evaluated)
        other = prompts.DemonstrationSampler(pool, 8, seed=4, num_labels=2, balanced=balanced)
        assert any(sampler.sample(Example("x", None, 0, i)) != other.sample(Example("x", None, 0, i))
                   for i in range(5))


def test_sampler_is_uniform_and_balanced_draws_per_class():
    pool = _pool()
    sampler = prompts.DemonstrationSampler(pool, 4, seed=0, num_labels=2)
    counts = collections.Counter(d.idx for i in range(2000) for d in sampler.sample(Example("x", None, 0, i)))
    frequency = np.array([counts[i] for i in range(40)]) / 2000
    np.testing.assert_allclose(frequency, 4 / 40, atol=0.025)  # 4 of 40 each time; sd ~0.0067
    first = collections.Counter(sampler.sample(Example("x", None, 0, i))[0].label for i in range(2000))
    assert abs(first[1] / 2000 - 0.25) < 0.04  # uniform draws follow the train split's label distribution

    balanced = prompts.DemonstrationSampler(pool, 5, seed=0, num_labels=2, balanced=True)
    per_class, positions = collections.Counter(), collections.Counter()
    for i in range(1000):
        demos = balanced.sample(Example("x", None, 0, i))
        positives = sum(d.label for d in demos)
        assert positives in (2, 3)  # 5 // 2 each, the fifth to a random class
        per_class[positives] += 1
        positions[demos[0].label] += 1
    assert abs(per_class[3] / 1000 - 0.5) < 0.06 and abs(positions[1] / 1000 - 0.5) < 0.06  # shuffled order


# ----------------------------------------------------------------------------------------------
# Context overflow.


def test_overflow_drops_oldest_demonstrations_then_truncates_from_the_left():
    fmt = prompts.prompt_format("sst2")
    demos, query = TRAIN[:3], DEV[0]

    def encode(text):
        return [ord(ch) for ch in text]

    def length(n_kept):  # characters of the prompt with the newest n_kept demonstrations, from the definition
        blocks = [SST2] + [f"Input: {d.text_a}\nPolarity: {fmt.label_words[d.label]}" for d in demos[3 - n_kept:]]
        return len("\n\n".join(blocks + [f"Input: {query.text_a}\nPolarity:"]))

    assert prompts.fit_prompt(fmt, demos, query, encode, length(3)).num_dropped == 0
    for budget, kept in ((length(3) - 1, 2), (length(2), 2), (length(1) + 5, 1), (length(0), 0)):
        fitted = prompts.fit_prompt(fmt, demos, query, encode, budget)
        assert (fitted.num_demonstrations, fitted.num_dropped, fitted.num_truncated) == (kept, 3 - kept, 0)
        assert fitted.text == prompts.build_prompt(fmt, demos[3 - kept:], query)  # the newest ones stay
        assert len(fitted.ids) == length(kept) <= budget
    fitted = prompts.fit_prompt(fmt, demos, query, encode, 30)
    assert (fitted.num_demonstrations, fitted.num_dropped, fitted.num_truncated) == (0, 3, length(0) - 30)
    assert "".join(map(chr, fitted.ids)) == (SST2 + f"\n\nInput: {query.text_a}\nPolarity:")[-30:]
    with pytest.raises(UserError, match="label word"):
        prompts.fit_prompt(fmt, demos, query, encode, 0)


def test_overflow_is_reported(char_tokenizer):
    """Through evaluate_fewshot: a context that fits about one demonstration drops the others."""
    fmt = prompts.prompt_format("sst2")
    zero_shot = max(len(prompts.build_prompt(fmt, [], e)) for e in DEV)
    context = zero_shot + len(" positive") + 45  # room for the query and about one short demonstration
    result = fewshot.evaluate_fewshot("sst2", DEV, TRAIN, char_tokenizer, _planted_scorer(char_tokenizer),
                                      k=3, seed=0, max_length=context)
    summary = result.summary()
    assert all(len(p.ids) + len(" positive") <= context for p in result.prompts)
    assert summary["mean_dropped_demonstrations"] == np.mean([p.num_dropped for p in result.prompts]) >= 2
    assert summary["mean_demonstrations"] == pytest.approx(3 - summary["mean_dropped_demonstrations"])
    assert summary["truncated_prompts"] == 0
    tiny = fewshot.evaluate_fewshot("sst2", DEV, TRAIN, char_tokenizer, lambda p, c: np.zeros((len(p), len(c))),
                                    k=1, seed=0, max_length=40)
    assert all(len(p.ids) == 40 - len(" positive") for p in tiny.prompts)
    assert tiny.summary()["truncated_prompts"] == len(DEV) and tiny.summary()["mean_demonstrations"] == 0


# ----------------------------------------------------------------------------------------------
# Scores: against transformers, and a planted scorer through the metrics.


def test_scores_match_transformers_gpt2(char_tokenizer):
    """Every (prompt, label word) pair scored alone by GPT2LMHeadModel in torch (the same weights): the sum and
    the per-token mean of log P(label tokens | prompt) match our padded batch calls, and so do predictions."""
    config = GPTConfig(vocab_size=char_tokenizer.vocab_size, n_positions=320, d_model=32, num_layers=2,
                       num_heads=2, d_ff=64, dropout_rate=0.0, attention_dropout_rate=0.0)
    params = gpt_random_params(config, seed=3)
    lm = LanguageModel(GPT(config), params, char_tokenizer, "test")
    reference = _transformers_copy(config, params)
    words = ["negative", "positive!"]  # different lengths, so that the mean differs from the sum
    for normalize in (False, True):
        result = fewshot.evaluate_fewshot("sst2", DEV, TRAIN, char_tokenizer,
                                          fewshot.lm_scorer(lm, normalize=normalize, batch_size=2),
                                          k=2, seed=1, max_length=config.n_positions, label_words=words)
        assert {p.num_demonstrations for p in result.prompts} == {2}
        expected = np.zeros((len(DEV), 2))
        for n, fitted in enumerate(result.prompts):
            for c, word in enumerate(words):
                prompt, completion = char_tokenizer.encode(fitted.text), char_tokenizer.encode(" " + word)
                with torch.no_grad():
                    logits = reference(input_ids=torch.tensor([prompt + completion])).logits[0]
                log_probs = torch.log_softmax(logits.double(), -1).numpy()
                total = sum(log_probs[len(prompt) + j - 1, t] for j, t in enumerate(completion))
                expected[n, c] = total / len(completion) if normalize else total
        np.testing.assert_allclose(result.scores, expected, atol=1e-4, rtol=0)
        np.testing.assert_array_equal(result.predictions, expected.argmax(-1))
        assert np.ptp(expected[:, 0] - expected[:, 1]) > 1e-2  # the prompts matter to the scores


def _transformers_copy(config: GPTConfig, params) -> transformers.GPT2LMHeadModel:
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt_config_to_hf(config))).eval()
    missing, unexpected = reference.load_state_dict(
        {k: torch.tensor(v) for k, v in hf_state_dict_from_gpt(params, config).items()}, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    assert reference.lm_head.weight.data_ptr() == reference.transformer.wte.weight.data_ptr()
    return reference


def test_rows_that_fill_the_context_score_like_transformers():
    """A row exactly as long as a context that is no multiple of the padding: padding must not reach
    positions the model has no embedding for (they would turn the padded attention into NaN)."""
    config = GPTConfig(vocab_size=50, n_positions=37, d_model=32, num_layers=1, num_heads=2, d_ff=64,
                       dropout_rate=0.0, attention_dropout_rate=0.0)
    params = gpt_random_params(config, seed=5)
    rng = np.random.default_rng(0)
    prompts_ids = [list(rng.integers(0, 50, n)) for n in (34, 20, 1)]
    completion_ids = [[7, 8, 9], [11]]
    ours = fewshot.completion_scores(GPT(config), params, prompts_ids, completion_ids, pad_id=0, max_length=37)
    reference = _transformers_copy(config, params)
    for n, prompt in enumerate(prompts_ids):
        for c, completion in enumerate(completion_ids):
            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([prompt + completion])).logits[0]
            log_probs = torch.log_softmax(logits.double(), -1).numpy()
            expected = sum(log_probs[len(prompt) + j - 1, t] for j, t in enumerate(completion))
            assert abs(ours[n, c] - expected) < 1e-4, (n, c)
    with pytest.raises(ValueError, match="longer than the model's context"):
        fewshot.completion_scores(GPT(config), params, [list(range(35))], completion_ids, pad_id=0, max_length=37)


def _planted_scorer(tokenizer, *, wrong: bool = False):
    """Reads each prompt back, finds the evaluated example by its text, and favours its label (or not)."""
    def score(prompt_ids, completion_ids):
        assert [tokenizer.decode(c) for c in completion_ids][0].startswith(" ")
        out = np.zeros((len(prompt_ids), len(completion_ids)))
        for n, ids in enumerate(prompt_ids):
            query = tokenizer.decode(ids).split("\n\n")[-1]
            (label,) = [e.label for e in DEV + CoLA_DEV if f": {e.text_a}\n" in query + "\n"]
            out[n, (1 - label) if wrong else label] = 1.0
        return out
    return score


CoLA_DEV = [Example("the cat sat .", None, 1, 0), Example("sat cat the .", None, 0, 1),
            Example("she reads books .", None, 1, 2), Example("reads she .", None, 0, 3),
            Example("they left early .", None, 1, 4), Example("we is here .", None, 0, 5),
            Example("he smiled .", None, 1, 6)]


def test_planted_scorer_gives_perfect_metrics_and_the_majority_baseline(char_tokenizer):
    right = fewshot.evaluate_fewshot("cola", CoLA_DEV, TRAIN, char_tokenizer, _planted_scorer(char_tokenizer),
                                     k=2, seed=0, max_length=1000)
    np.testing.assert_array_equal(right.predictions, [e.label for e in CoLA_DEV])
    assert right.metrics == {"matthews_corr": 1.0, "accuracy": 1.0}
    # TRAIN has four of each class: the tie goes to class 0 ('unacceptable'), predicted for all 7 examples
    assert right.majority_class == 0
    assert right.majority_metrics == {"matthews_corr": 0.0, "accuracy": 3 / 7}
    assert right.summary()["majority_baseline"]["label"] == "unacceptable"
    wrong = fewshot.evaluate_fewshot("cola", CoLA_DEV, TRAIN, char_tokenizer,
                                     _planted_scorer(char_tokenizer, wrong=True), k=2, seed=0, max_length=1000)
    assert wrong.metrics == {"matthews_corr": -1.0, "accuracy": 0.0}
    assert wrong.summary()["prediction_counts"] == {"unacceptable": 4, "acceptable": 3}


def test_subset_is_fixed_and_in_file_order():
    examples = [Example(str(i), None, 0, i) for i in range(50)]
    chosen = fewshot.subset(examples, 10)
    assert chosen == fewshot.subset(examples, 10) and len({e.idx for e in chosen}) == 10
    assert [e.idx for e in chosen] == sorted(e.idx for e in chosen) and chosen != examples[:10]
    assert fewshot.subset(examples, 0) == examples == fewshot.subset(examples, 80)


# ----------------------------------------------------------------------------------------------
# Errors.


def test_user_errors(char_tokenizer, tmp_path):
    def run(task="sst2", examples=DEV, train=TRAIN, **kwargs):
        options = dict(k=2, seed=0, max_length=1000) | kwargs
        return fewshot.evaluate_fewshot(task, examples, train, char_tokenizer, _planted_scorer(char_tokenizer),
                                        **options)

    with pytest.raises(UserError, match="unknown GLUE task 'sst3'"):
        run("sst3")
    with pytest.raises(UserError, match="'stsb' is a regression task"):
        run("sts-b")
    with pytest.raises(UserError, match="--k=9 is larger .* train split has 8 examples"):
        run(k=9)
    with pytest.raises(UserError, match="--k=9 .* class 0 of the train split has 4 examples"):
        run(k=9, balanced=True)  # 5 per class needed, 4 there
    with pytest.raises(UserError, match="--k=-1"):
        run(k=-1)
    with pytest.raises(UserError, match="2 distinct non-empty words"):
        run(label_words=["bad", "bad"])
    with pytest.raises(UserError, match="has no labels"):
        run(examples=[Example("x", None, -1, 0)])
    narrow = tmp_path / "narrow.txt"
    narrow.write_text(string.ascii_letters + " .,:\n")
    # the braces of the instruction's label set are the format's, not a dev example's (they used to be blamed)
    with pytest.raises(UserError, match=r"^the sst2 prompt format \(its instruction, label set \{negative, positive\} "
                       r"and indicators, before any example\): characters '\{\}' are not in the char vocabulary"):
        fewshot.evaluate_fewshot("sst2", DEV, TRAIN, CharTokenizer(str(narrow)), _planted_scorer(char_tokenizer),
                                 k=0, seed=0, max_length=1000)
    narrow.write_text(string.ascii_letters + " .,:\n{}")  # the format fits; an example's apostrophe does not
    with pytest.raises(UserError, match=r"^sst2 dev example 7 \(with its demonstrations, in the prompt\): "
                       r"characters \"'\" are not in the char vocabulary"):
        fewshot.evaluate_fewshot("sst2", [*DEV, Example("it 's fine .", None, 1, 7)], TRAIN,
                                 CharTokenizer(str(narrow)), _planted_scorer(char_tokenizer), k=0, seed=0,
                                 max_length=1000)


@pytest.mark.slow  # the flag's default is read at import: a fresh interpreter per environment
def test_glue_dir_defaults_to_the_glue_dir_environment_variable_as_configs_glue_does(tmp_path):
    """pretrain.fewshot used to ignore $GLUE_DIR, which configs/glue.py honours."""
    code = ("from absl import flags; import pretrain.fewshot; from configs import glue; "
            "print(flags.FLAGS['glue_dir'].default, glue.get_config('task=sst2').data.glue_dir)")
    for env, expected in [({"GLUE_DIR": str(tmp_path)}, str(tmp_path)), ({}, "../shared/data/glue")]:
        proc_env = {k: v for k, v in subprocess_env().items() if k != "GLUE_DIR"} | env
        out = subprocess.run([sys.executable, "-c", code], env=proc_env, capture_output=True, text=True, check=True,
                             cwd=REPO)
        assert out.stdout.split() == [expected, expected], out.stderr


# ----------------------------------------------------------------------------------------------
# The command, on a tiny GPT trained by the real command.


@pytest.fixture(scope="module")
def char_workdir(char_gpt_glue_workdir) -> str:
    """A 30-step Shakespeare GPT whose char vocabulary also holds SST-2's text and the prompt template
    (the session's, tests/conftest.py)."""
    return char_gpt_glue_workdir


@pytest.mark.slow
def test_command_on_a_tiny_trained_gpt(char_workdir, tmp_path):
    glue_dir = os.path.join(SHARED_DATA, "glue")
    proc = run_module("pretrain.fewshot", [
        f"--init={char_workdir}", "--task=sst2", "--k=2", "--seed=0", f"--glue_dir={glue_dir}",
        "--max_examples=12", f"--output={tmp_path}"])
    assert "\nPolarity:" in proc.stdout and "metrics: accuracy=" in proc.stdout
    assert "majority_baseline: label=positive" in proc.stdout  # SST-2 train: 56% positive
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["num_examples"] == 12 and results["k"] == 2 and results["context"] == 64
    # a 64-character context holds no demonstration: all dropped, every prompt cut from the left
    assert results["mean_dropped_demonstrations"] == 2 and results["truncated_prompts"] == 12
    assert set(results["metrics"]) == {"accuracy"} and 0 <= results["metrics"]["accuracy"] <= 1
    rows = (tmp_path / "predictions.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["idx", "label", "prediction", "score_negative", "score_positive",
                                   "demonstrations"] and len(rows) == 13

    # the same model read with the Shakespeare-only vocabulary: a one-line error naming the characters
    shakespeare = os.path.join(SHARED_DATA, "tinyshakespeare/input.txt")
    proc = run_module("pretrain.fewshot", [f"--init={char_workdir}", "--task=sst2", f"--glue_dir={glue_dir}",
                                                    f"--tokenizer_path={shakespeare}", "--max_examples=2"], check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not in the char vocabulary" in proc.stderr
    proc = run_module("pretrain.fewshot", [f"--init={char_workdir}", "--task=stsb"], check=False)
    assert proc.returncode == 2 and "regression task" in proc.stderr and proc.stderr.count("\n") == 1
