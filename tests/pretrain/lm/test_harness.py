"""pretrain/lm/harness.py: lm-eval's `lmpretrain` model type on a GPT workdir against lm-eval's `hf` type on the
exported GPT2LMHeadModel, over three local tasks (multiple choice, rolling perplexity, generate_until): every
request's log-likelihood within 1e-4, identical greedy generations, identical metrics. Then a masked LM through the
same type, and the command's one-line refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest


from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from models.gpt import GPTConfig
from pretrain.lm import harness
from pretrain.tools import export_hf_bert
from tests.helpers.commands import run_module
from tests.helpers.lm_eval_tasks import TASKS, write_gpt_bpe_tokenizer, write_tasks
from tests.helpers.random_weights import gpt_random_params
from tests.helpers.masked_lms import fake_run, masked_run

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """(a GPT pretraining config with a BPE tokenizer.json, O(1) random weights, the tasks' folder)."""
    from configs import gpt2

    root = tmp_path_factory.mktemp("harness")
    config = gpt2.get_config()
    config.tokenizer.update(kind="gpt2_bpe", path=write_gpt_bpe_tokenizer(str(root / "tokenizer.json")))
    config.model.update(vocab_size=320, n_positions=48, d_model=32, num_layers=2, num_heads=4, d_ff=64)
    model = GPTConfig(vocab_size=320, n_positions=48, d_model=32, num_layers=2, num_heads=4, d_ff=64)
    return config, gpt_random_params(model, seed=3), write_tasks(str(root / "tasks"))


def evaluate(model, tasks: str, **kwargs) -> dict:
    return simple_evaluate(model=model, tasks=list(TASKS), task_manager=TaskManager(include_path=tasks),
                           log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                           fewshot_random_seed=0, **kwargs)


def responses(result: dict, task: str) -> list:
    """Each request's response, documents in order (log-likelihood tasks: (log-likelihood, is_greedy) or the
    log-likelihood; generate_until: the text)."""
    return [response[0] for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"])
            for response in sample["resps"]]


def test_lmpretrain_scores_every_request_as_the_hf_type_scores_the_export(gpt_run, tmp_path, monkeypatch):
    config, params, tasks = gpt_run
    workdir = fake_run(tmp_path / "run", config, params, monkeypatch)
    message = export_hf_bert.export(workdir, str(tmp_path / "hf"))
    assert "converted to tokenizer.json" in message
    theirs = evaluate("hf", tasks, model_args=f"pretrained={tmp_path / 'hf'},dtype=float32", device="cpu",
                      batch_size=1)
    ours = evaluate(harness.PretrainLM(workdir=workdir, batch_size=4), tasks)
    for task in ("tiny_choice", "tiny_rolling"):
        flat = list(zip(responses(ours, task), responses(theirs, task), strict=True))
        scores = np.array([[np.ravel(x)[0], np.ravel(y)[0]] for x, y in flat], float)
        assert np.abs(scores[:, 0] - scores[:, 1]).max() < TOLERANCE, task
        assert np.ptp(scores[:, 1]) > 1  # the requests differ: a constant would not pass
        if task == "tiny_choice":  # is_greedy, as lm-eval's acc tie-breaks read it
            assert [bool(x[1]) for x, _ in flat] == [bool(y[1]) for _, y in flat]
    assert_minimal_pairs_score_as_lm_eval_blimp(workdir)
    generated, reference = responses(ours, "tiny_generate"), responses(theirs, "tiny_generate")
    assert generated == reference and any(reference)
    for task in TASKS:
        for metric, value in theirs["results"][task].items():
            if isinstance(value, float) and not math.isnan(value):
                assert ours["results"][task][metric] == pytest.approx(value, rel=1e-5, abs=1e-6), (task, metric)


def test_a_masked_lm_scores_choices_by_pll_and_refuses_to_generate(tmp_path_factory, tmp_path, monkeypatch):
    from pretrain.lm import masked_lm

    _, config, params = masked_run(tmp_path_factory, "bert", seed=1)
    workdir = fake_run(tmp_path / "run", config, params, monkeypatch)
    model = harness.PretrainLM(workdir=workdir)

    class Request:
        def __init__(self, *args):
            self.args = args
    sentence = "Shall I compare thee to a summer's day?"
    (whole, _), (split, _) = model.loglikelihood([Request("", sentence), Request("Shall I", " compare thee")])
    assert whole == pytest.approx(masked_lm.sentence_scores(model.lm, [sentence])[0], abs=1e-4)
    assert split < 0 and split > whole  # two tokens scored, with the rest of the text visible
    with pytest.raises(Exception, match=r"a masked LM \(bert\) does not generate text"):
        model.generate_until([Request("Shall I", {"until": ["\n"]})])


@pytest.mark.slow  # two commands
def test_the_command_refuses_an_unknown_task_a_malformed_row_and_a_distillation_workdir_in_one_line(
        tiny_gpt_workdir, tmp_path):
    from configs import distil

    result = run_module("pretrain.lm_eval", ["--model", "lmpretrain", "--model_args", f"workdir={tiny_gpt_workdir}",
                                             "--tasks", "no_such_task_anywhere"], check=False)
    assert result.returncode == 2 and "no_such_task_anywhere" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    tasks = write_tasks(str(tmp_path / "tasks"))
    with open(f"{tasks}/tiny_choice.jsonl", "a") as f:
        f.write('{"context": "a", \n')
    result = run_module("pretrain.lm_eval", ["--model", "lmpretrain", "--model_args", f"workdir={tiny_gpt_workdir}",
                                             "--tasks", "tiny_choice", "--include_path", tasks], check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: a task's data cannot be read: Failed to load JSON from file '{tasks}/tiny_choice.jsonl' with error "
        "<class 'pyarrow.lib.ArrowInvalid'>: JSON parse error: Missing a name for object member. in row 12 (fix the "
        "file: JSON lines are one object a line)")
    assert "Traceback" not in result.stderr
    run = tmp_path / "distil"
    run.mkdir()
    (run / "config.json").write_text(distil.get_config().to_json())
    result = run_module("pretrain.lm_eval", ["--model", "lmpretrain", "--model_args", f"workdir={run}",
                                             "--tasks", "tiny_choice", "--include_path", write_tasks(str(tmp_path))],
                        check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: workdir={run} holds a distil model, which lm-eval cannot score here: give a GPT, a T5 or a masked LM "
        "(bert, modernbert, electra) workdir or Hugging Face directory")


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory):
    """(a T5 pretraining config with a SentencePiece tokenizer whose end of sequence is [SEP], O(1) random weights,
    the same model as transformers' T5ForConditionalGeneration, a transformers tokenizer appending [SEP] as T5's
    appends </s>)."""
    import torch
    import transformers
    from tokenizers import processors

    from configs import t5
    from models import model_config
    from models.convert.hf_t5 import hf_state_dict_from_t5, t5_config_to_hf
    from pretrain.data import tokenizers
    from pretrain.tools.train_tokenizer import train_sentencepiece
    from tests.helpers.modernbert import training_texts
    from tests.helpers.random_weights import t5_random_params

    root = tmp_path_factory.mktemp("harness_t5")
    (root / "corpus.txt").write_text("\n".join(training_texts()))
    spm = train_sentencepiece(str(root / "corpus.txt"), str(root / "spm"), 300, lowercase=False)
    config = t5.get_config()
    config.tokenizer.update(path=spm, extra_ids=0)
    config.model.update(vocab_size=320, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
                        num_decoder_layers=2)
    model = model_config(config.model)
    params = t5_random_params(model, seed=4)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**{**t5_config_to_hf(model),
                                                                          "eos_token_id": 3})).eval()
    hf.load_state_dict({k: torch.tensor(v) for k, v in hf_state_dict_from_t5(params, model).items()}, strict=False)
    ours = tokenizers.from_config(config.tokenizer)
    pipeline = ours.hf_pipeline()
    pipeline.post_processor = processors.TemplateProcessing(single="$A:0 [SEP]:0", special_tokens=[("[SEP]", 3)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=pipeline, eos_token="[SEP]",
                                                     pad_token=ours.id_to_piece(0))
    return config, params, hf, tokenizer, write_tasks(str(root / "tasks"))


def test_a_t5_scores_every_request_as_the_hf_type_scores_transformers_t5(t5_run, tmp_path, monkeypatch):
    from lm_eval.models.huggingface import HFLM

    config, params, hf, tokenizer, tasks = t5_run
    workdir = fake_run(tmp_path / "run", config, params, monkeypatch)
    scored = ["tiny_choice", "tiny_rolling"]
    theirs = simple_evaluate(model=HFLM(pretrained=hf, tokenizer=tokenizer, backend="seq2seq", batch_size=1,
                                        device="cpu"), tasks=scored, task_manager=TaskManager(include_path=tasks),
                             log_samples=True)
    ours = simple_evaluate(model=harness.PretrainLM(workdir=workdir, batch_size=4), tasks=scored,
                           task_manager=TaskManager(include_path=tasks), log_samples=True)
    for task in scored:
        flat = list(zip(responses(ours, task), responses(theirs, task), strict=True))
        scores = np.array([[np.ravel(x)[0], np.ravel(y)[0]] for x, y in flat], float)
        assert np.abs(scores[:, 0] - scores[:, 1]).max() < TOLERANCE, task
        assert np.ptp(scores[:, 1]) > 1
        for metric, value in theirs["results"][task].items():
            if isinstance(value, float) and not math.isnan(value):
                assert ours["results"][task][metric] == pytest.approx(value, rel=1e-5, abs=1e-6), (task, metric)
    assert_minimal_pairs_score_as_lm_eval_blimp(workdir)


def assert_minimal_pairs_score_as_lm_eval_blimp(workdir: str) -> None:
    """pretrain.minimal_pairs' sentence scores are lm-eval's blimp requests: loglikelihood("", sentence)."""
    from pretrain.lm import minimal_pairs

    class Request:
        def __init__(self, *args):
            self.args = args
    sentences = ["Thou art more lovely.", "The kings are here, and the queen is there."]
    blimp = [score for score, _ in harness.PretrainLM(workdir=workdir).loglikelihood([Request("", s) for s in sentences])]
    np.testing.assert_allclose(minimal_pairs.sentence_scorer(workdir)(sentences), blimp, atol=1e-5)


def test_a_t5_generates_what_transformers_greedy_generate_gives(t5_run, tmp_path, monkeypatch):
    import torch

    config, params, hf, tokenizer, _ = t5_run
    model = harness.PretrainLM(workdir=fake_run(tmp_path / "run", config, params, monkeypatch), batch_size=2)

    class Request:
        def __init__(self, *args):
            self.args = args
    contexts = ["Shall I compare thee", "First Citizen: Before we proceed any further, hear me"]
    ours = model.generate_until([Request(c, {"until": ["zzz"], "max_gen_toks": 10}) for c in contexts])
    theirs = []
    for context in contexts:
        ids = torch.tensor([tokenizer(context)["input_ids"]])
        new = hf.generate(input_ids=ids, max_new_tokens=10, do_sample=False, pad_token_id=0)[0, 1:].tolist()
        theirs.append(tokenizer.decode(new, skip_special_tokens=True).split("zzz")[0])
    assert ours == theirs and all(ours)


def test_a_misspelt_or_missing_model_arg_is_one_line():
    from pretrain.runtime.errors import UserError

    with pytest.raises(UserError, match=r"--model_args worKdir: not a key of lmpretrain \(its keys: workdir, "):
        harness.PretrainLM(worKdir="runs/gpt")
    with pytest.raises(UserError, match=r"--model lmpretrain needs --model_args workdir=PATH"):
        harness.PretrainLM(batch_size=4, device="cpu")
