"""pretrain/lm/perplexity.py: sliding-window NLL against Hugging Face's guide loop on the same GPT converted to
transformers' GPT2LMHeadModel, window coverage, the text readers and the command on a workdir."""
from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch
import transformers

from models.convert.hf_gpt2 import gpt_config_to_hf, hf_state_dict_from_gpt
from models.gpt import GPT, GPTConfig
from pretrain.data.tokenizers import CharTokenizer
from pretrain.lm import perplexity as ppl
from pretrain.lm.language_model import LanguageModel
from pretrain.runtime.errors import UserError
from pretrain.workdir import checkpoints
from tests.helpers.commands import run_module
from tests.helpers.random_weights import gpt_random_params

CONTEXT = 16
TOLERANCE = 1e-4


def random_text(characters: int, seed: int = 0) -> str:
    """Words of letters with spaces and newlines: a vocabulary of 28 characters."""
    rng = np.random.default_rng(seed)
    chars = rng.choice(list("abcdefghijklmnopqrstuvwxyz \n"), characters, p=[0.03] * 26 + [0.14, 0.08])
    return "".join(chars)


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> LanguageModel:
    path = tmp_path_factory.mktemp("text") / "vocab.txt"
    path.write_text(random_text(2000))
    tokenizer = CharTokenizer(str(path))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=CONTEXT, d_model=32, num_layers=2, num_heads=4,
                       d_ff=64, dropout_rate=0.0, attention_dropout_rate=0.0)
    return LanguageModel(GPT(config), gpt_random_params(config, seed=2), tokenizer, "test")


@pytest.fixture(scope="module")
def hf_model(lm) -> transformers.GPT2LMHeadModel:
    hf_config = transformers.GPT2Config(**{**gpt_config_to_hf(lm.config), "bos_token_id": None, "eos_token_id": None})
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    state = {name: torch.tensor(array) for name, array in hf_state_dict_from_gpt(lm.params, lm.config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected     # tied to wte
    return model


def guide_loop(model, ids: np.ndarray, stride: int) -> tuple[float, int]:
    """The loop of Hugging Face's "Perplexity of fixed-length models" -> (summed NLL, tokens counted).

    As the guide, except that each window's mean loss is weighted by the labels the loss actually
    averaged (after its internal shift); the guide's `num_valid_tokens - batch_size` is one short
    whenever the window's first label is already -100."""
    input_ids = torch.tensor(ids[None], dtype=torch.long)
    max_length, seq_len = model.config.n_positions, input_ids.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc  # may be different from stride on last loop
        window = input_ids[:, begin_loc:end_loc]
        target_ids = window.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(window, labels=target_ids).loss
        counted = int((target_ids[:, 1:] != -100).sum())
        if counted:
            nll_sum += float(loss) * counted
            n_tokens += counted
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return nll_sum, n_tokens


@pytest.mark.parametrize("length, stride", [(203, 5), (203, CONTEXT), (40, 1), (11, 4)])
def test_nll_equals_the_guide_loop_on_transformers(lm, hf_model, length, stride):
    ids = np.asarray(lm.tokenizer.encode(random_text(length, seed=length + stride)), np.int32)
    nll = ppl.token_nlls(lm, ids, stride=stride, batch_size=4)
    expected_sum, expected_count = guide_loop(hf_model, ids, stride)
    scored = ~np.isnan(nll)
    assert scored.sum() == expected_count
    assert abs(nll[scored].mean() - expected_sum / expected_count) < TOLERANCE
    assert nll[scored].mean() > 1.0   # random weights: far from a trivial zero loss


@pytest.mark.parametrize("length", [1, 2, 15, 16, 17, 50, 203])
@pytest.mark.parametrize("stride", [1, 5, 8, CONTEXT])
def test_every_token_is_scored_once_with_the_most_context_its_window_gives(length, stride):
    windows = ppl.sliding_windows(length, CONTEXT, stride)
    times_scored = np.zeros(length, int)
    for begin, end, first_target in windows:
        assert 0 <= begin < first_target < end <= min(begin + CONTEXT, length)
        times_scored[first_target:end] += 1
        if begin > 0:    # after the first window, at least context - stride tokens of left context
            assert first_target - begin >= CONTEXT - stride
    window_starts = set(range(0, length, stride))   # the guide's begin_loc values
    # Only a token without context in its window goes unscored: the text's first and, with disjoint
    # windows (stride = context), each window's first.
    expected = np.array([0 if t == 0 or (stride == CONTEXT and t in window_starts) else 1 for t in range(length)])
    np.testing.assert_array_equal(times_scored, expected)
    if stride < CONTEXT:
        assert times_scored.sum() == max(length - 1, 0)


def test_documents_are_joined_like_training_and_the_last_fraction_is_scored(lm, tmp_path):
    path = tmp_path / "docs.txt"
    documents = [["ab cd", "ef"], ["gh"], ["ij kl", "mn", "op"], ["qr"]]
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    ids, characters = ppl.evaluation_tokens(str(path), lm.tokenizer, raw_text=False, eval_fraction=0.5)
    assert lm.tokenizer.decode(ids) == "ij klmnopqr" and characters == 11   # no end-of-text in a char vocabulary

    class WithEndOfText(CharTokenizer):   # 'z' stands in for an end-of-text token
        eos_id = property(lambda self: self._index["z"])
    ids, _ = ppl.evaluation_tokens(str(path), WithEndOfText(lm.tokenizer._path), raw_text=False, eval_fraction=0.5)
    assert lm.tokenizer.decode(ids) == "ij klmnopzqr"                        # between documents, as in training
    ids, characters = ppl.evaluation_tokens(str(path), lm.tokenizer, raw_text=True, eval_fraction=0.25)
    text = path.read_text()
    assert lm.tokenizer.decode(ids) == text[int(len(text) * 0.75):] and characters == len(ids)


def test_user_errors(lm, tmp_path):
    with pytest.raises(UserError, match=r"stride=0 must be in \[1, 16\]"):
        ppl.sliding_windows(100, CONTEXT, 0)
    with pytest.raises(UserError, match="stride=17"):
        ppl.sliding_windows(100, CONTEXT, 17)
    with pytest.raises(UserError, match="at least 2"):
        ppl.token_nlls(lm, np.array([3], np.int32), stride=4)
    with pytest.raises(UserError, match="batch_size=0"):
        ppl.token_nlls(lm, np.array([3, 4, 5], np.int32), stride=4, batch_size=0)
    (tmp_path / "t.txt").write_text("ab cd")
    for fraction in (0.0, 1.5):
        with pytest.raises(UserError, match="eval_fraction"):
            ppl.evaluation_tokens(str(tmp_path / "t.txt"), lm.tokenizer, raw_text=True, eval_fraction=fraction)
    with pytest.raises(UserError, match="not found"):
        ppl.evaluation_tokens(str(tmp_path / "missing.txt"), lm.tokenizer, raw_text=True, eval_fraction=1.0)


# ----------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------

def write_workdir(directory, lm: LanguageModel, tokenizer_path: str) -> None:
    """What pretrain.train leaves for a GPT: config.json (model + tokenizer) and an Orbax checkpoint."""
    config = {"model": {"name": "gpt", **dataclasses.asdict(lm.config)},
              "tokenizer": {"kind": "char", "path": tokenizer_path, "lowercase": False}}
    (directory / "config.json").write_text(json.dumps(config))
    checkpointer = checkpoints.Checkpointer(str(directory / "checkpoints"), save_every=1, keep=1, async_save=False)
    checkpointer.save(7, {"params": lm.params}, {})
    checkpointer.close()


@pytest.mark.slow
def test_command_prints_the_perplexity_of_the_held_out_text(lm, hf_model, tmp_path):
    write_workdir(tmp_path, lm, lm.tokenizer._path)
    text = random_text(300, seed=9)
    (tmp_path / "eval.txt").write_text(text)
    args = [f"--init={tmp_path}", f"--data={tmp_path / 'eval.txt'}", "--raw_text", "--eval_fraction=0.5",
            "--stride=6", "--batch_size=3"]
    printed = run_module("pretrain.perplexity", args).stdout
    value = {key: float(re.search(rf"^{key}: ([\d.]+)", printed, re.M)[1])
             for key in ("mean NLL", "perplexity", "bits per character")}
    assert math.isclose(value["perplexity"], math.exp(value["mean NLL"]), rel_tol=2e-6)
    assert math.isclose(value["bits per character"], value["mean NLL"] / math.log(2), rel_tol=2e-6)   # char model

    held_out = np.asarray(lm.tokenizer.encode(text[150:]), np.int32)
    nll_sum, count = guide_loop(hf_model, held_out, stride=6)
    assert f"tokens scored: {count} of 150 (context 16, stride 6)" in printed
    assert abs(value["mean NLL"] - nll_sum / count) < TOLERANCE

    failed = run_module("pretrain.perplexity", args[:2] + ["--stride=99"], check=False)
    assert failed.returncode == 2 and failed.stderr.strip().count("\n") == 0 and "stride=99" in failed.stderr
