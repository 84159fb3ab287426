"""pretrain/lm/generation.py: cached + windowed decoding against a loop of full forward passes, sampling,
stop strings, end-of-text, user errors, and the command on a workdir trained by pretrain.train."""
from __future__ import annotations

import functools
import os
import re

import jax
import numpy as np
import pytest

from models.gpt import GPT, GPTConfig
from pretrain.data.tokenizers import CharTokenizer
from pretrain.lm import generation as gen
from pretrain.lm.language_model import LanguageModel, load_language_model
from pretrain.runtime.errors import UserError
from tests.helpers.commands import run_module
from tests.helpers.paths import SHARED_DATA
from tests.helpers.random_weights import gpt_random_params

ALPHABET = "abcdefghijklmnopqrstuvwxyz |\n:"   # the char vocabulary (sorted by CharTokenizer)
CONFIG = GPTConfig(vocab_size=len(ALPHABET), n_positions=16, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                   dropout_rate=0.0, attention_dropout_rate=0.0)
SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare/input.txt")


@pytest.fixture(scope="module")
def params():
    """Random weights whose greedy continuations depend on the whole window. With gpt_random_params alone
    (tests/helpers/random_weights.py), greedy decoding soon repeats one token (the current token's own embedding
    dominates its tied logits; biases add a fixed favourite), so a wrong window could go unseen. Without
    biases and with a stronger, sharper attention, changing the first token of a 16-token window
    changes the last position's argmax about half the time."""
    scale = {"bias": 0.0, "['out']": 8.0, "['query']": 3.0, "['key']": 3.0}

    def rescale(path, leaf):
        name = jax.tree_util.keystr(path)
        return leaf * next((s for key, s in scale.items() if key in name), 1.0)
    return jax.tree_util.tree_map_with_path(rescale, gpt_random_params(CONFIG, seed=0))


@pytest.fixture(scope="module")
def char_lm(params, tmp_path_factory) -> LanguageModel:
    path = tmp_path_factory.mktemp("vocab") / "chars.txt"
    path.write_text(ALPHABET)
    return LanguageModel(GPT(CONFIG), params, CharTokenizer(str(path)), "test")


@functools.lru_cache(maxsize=None)
def _forward():
    return jax.jit(lambda p, x: GPT(CONFIG).apply({"params": p}, x)["logits"])


def reference_greedy(params, prompt: list[int], new_tokens: int) -> list[int]:
    """nanoGPT's loop without a cache: crop to the last n_positions tokens, full forward, argmax. The
    window is right-padded to n_positions (one compiled shape; causal attention never reads the padding)."""
    sequence = list(prompt)
    for _ in range(new_tokens):
        window = sequence[-CONFIG.n_positions:]
        padded = np.zeros((1, CONFIG.n_positions), np.int32)
        padded[0, :len(window)] = window
        sequence.append(int(np.asarray(_forward()(params, padded))[0, len(window) - 1].argmax()))
    return sequence[len(prompt):]


def prompts_of_lengths(lengths, seed=0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in lengths]


# 1 to 20 tokens, the last longer than the 16-token context; the tests share it (and compiled shapes).
PROMPTS = prompts_of_lengths([1, 6, 13, 20])
NEW_TOKENS = 11                                  # three rows slide past the context


# ----------------------------------------------------------------------------------------------
# Token level
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("new_tokens", [4, NEW_TOKENS])
def test_greedy_equals_a_loop_of_uncached_forward_passes(params, new_tokens):
    """Prompts of 1, 6, 13 and 20 tokens: with 4 new tokens two rows stay within the cache (the 20-token
    prompt is read through its last 16), with 11 three rows slide past the context."""
    prompts = PROMPTS
    ours = gen.generate_ids(GPT(CONFIG), params, prompts, new_tokens, sampling=gen.Sampling(greedy=True))
    expected = [reference_greedy(params, p, new_tokens) for p in prompts]
    assert ours == expected
    assert len({tuple(row) for row in expected}) == len(prompts)  # the prompts matter
    assert max(len(set(row)) for row in expected) >= min(new_tokens, 6)  # varied, not one repeated token


def test_sampling_is_reproducible_and_top_k_one_is_greedy(params):
    model = GPT(CONFIG)

    def draw(seed, top_k=0):
        return gen.generate_ids(model, params, PROMPTS, NEW_TOKENS, rng=jax.random.key(seed),
                                sampling=gen.Sampling(temperature=1.0, top_k=top_k))
    assert draw(0) == draw(0)
    assert draw(0) != draw(1)
    assert draw(5, top_k=1) == gen.generate_ids(model, params, PROMPTS, NEW_TOKENS, sampling=gen.Sampling(greedy=True))


@pytest.mark.parametrize("top_k", [0, 3])
def test_first_token_frequencies_follow_the_tempered_filtered_softmax(params, top_k):
    samples, temperature, prompt = 6000, 0.7, prompts_of_lengths([5], seed=2)[0]
    tokens = gen.generate_ids(GPT(CONFIG), params, [prompt] * samples, 1,
                              sampling=gen.Sampling(temperature=temperature, top_k=top_k), rng=jax.random.key(0))
    freq = np.bincount([row[0] for row in tokens], minlength=CONFIG.vocab_size) / samples
    logits = np.asarray(GPT(CONFIG).apply({"params": params}, np.array([prompt], np.int32))["logits"])[0, -1]
    scaled = logits / temperature
    if top_k:
        scaled = np.where(scaled < np.sort(scaled)[-top_k], -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    assert probs.max() < 0.9 and np.sum(probs > 0.02) >= 3     # a distribution worth testing
    tolerance = 4.5 * np.sqrt(probs * (1 - probs) / samples) + 1e-3
    np.testing.assert_array_less(np.abs(freq - probs), tolerance)


def test_end_of_text_ends_its_row_only(params):
    model, greedy = GPT(CONFIG), gen.Sampling(greedy=True)
    free = gen.generate_ids(model, params, PROMPTS, NEW_TOKENS, sampling=greedy)
    at = next(i for i in range(3, NEW_TOKENS) if free[1][i] not in free[1][:i])   # a first occurrence mid-row
    eos = free[1][at]
    stopped = gen.generate_ids(model, params, PROMPTS, NEW_TOKENS, sampling=greedy, stop_ids=[eos])
    for row, tokens in zip(stopped, free):
        end = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        assert row == tokens[:end]
    assert len(stopped[1]) == at + 1


# ----------------------------------------------------------------------------------------------
# Text level
# ----------------------------------------------------------------------------------------------

def test_stop_strings_cut_the_completion_and_end_rows(char_lm):
    greedy = gen.Sampling(greedy=True)
    free = gen.generate(char_lm, ["ab"], max_new_tokens=30, sampling=greedy)[0][0]
    assert free.finish_reason == "length" and len(free.text) == 30 and free.prompt == "ab"
    first, second = free.text[8:10], free.text[4]
    cut = gen.generate(char_lm, ["ab"], max_new_tokens=30, sampling=greedy, stop=[first, second])[0][0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:min(free.text.find(first), free.text.find(second))]
    # A one-character stop string is a stop token: the row ends where it is generated.
    ids = char_lm.tokenizer.encode("ab")
    stop_ids = gen.stop_token_ids(char_lm.tokenizer, [second, "not one token"])
    assert stop_ids == char_lm.tokenizer.encode(second)
    row = gen.generate_ids(char_lm.model, char_lm.params, [ids], 30, sampling=greedy, stop_ids=stop_ids)[0]
    assert char_lm.tokenizer.decode(row) == free.text[:free.text.find(second) + 1]


def eos_char_tokenizer(directory, character: str) -> CharTokenizer:
    """The char tokenizer with `character` as its end-of-text token (a stand-in for GPT-2's <|endoftext|>)."""
    class WithEos(CharTokenizer):
        @property
        def eos_id(self) -> int:
            return self._index[character]
    (directory / "chars.txt").write_text(ALPHABET)
    return WithEos(str(directory / "chars.txt"))


def test_end_of_text_ends_the_text_and_starts_unprompted_samples(char_lm, tmp_path):
    greedy = gen.Sampling(greedy=True)
    free = gen.generate(char_lm, ["ab"], max_new_tokens=30, sampling=greedy)[0][0].text
    lm = LanguageModel(char_lm.model, char_lm.params, eos_char_tokenizer(tmp_path, free[3]), "test")
    completion = gen.generate(lm, ["ab"], max_new_tokens=30, sampling=greedy)[0][0]
    assert completion.finish_reason == "eos" and completion.text == free[:free.find(free[3])]

    eos = lm.tokenizer.eos_id
    assert gen.unconditional_start(lm.tokenizer) == ([eos], "")
    assert gen.unconditional_start(char_lm.tokenizer) == (char_lm.tokenizer.encode("\n"), "\n")
    unprompted = gen.generate(lm, [""], max_new_tokens=5, sampling=greedy)[0][0]
    row = gen.generate_ids(lm.model, lm.params, [[eos]], 5, sampling=greedy, stop_ids=[eos])[0]
    assert unprompted.prompt == "" and unprompted.text == lm.tokenizer.decode(row[:-1] if row[-1] == eos else row)


def test_one_batch_gives_every_prompt_its_samples(char_lm):
    results = gen.generate(char_lm, ["ab", "zz:", ""], max_new_tokens=6, num_samples=3, seed=1)
    assert [len(r) for r in results] == [3, 3, 3]
    assert [r[0].prompt for r in results] == ["ab", "zz:", "\n"]
    assert len({c.text for c in results[0]}) > 1      # independent samples
    text = gen.format_completions(results)
    assert text.count("----- prompt ") == 9 and "----- prompt 2/3, sample 3/3 (length) -----\nzz:" in text


def test_user_errors(char_lm, tmp_path):
    model, params = char_lm.model, char_lm.params
    with pytest.raises(UserError, match="max_new_tokens=0"):
        gen.generate_ids(model, params, [[1]], 0)
    with pytest.raises(UserError, match="at least one token"):
        gen.generate_ids(model, params, [[1], []], 3)
    with pytest.raises(UserError, match="needs an rng"):
        gen.generate_ids(model, params, [[1]], 3)
    with pytest.raises(UserError, match="top_p"):
        gen.generate(char_lm, ["ab"], max_new_tokens=3, sampling=gen.Sampling(top_p=0.0))
    with pytest.raises(UserError, match="num_samples=0"):
        gen.generate(char_lm, ["ab"], num_samples=0)
    with pytest.raises(UserError, match="stop string is empty"):
        gen.generate(char_lm, ["ab"], stop=[""])
    with pytest.raises(UserError, match="not in the char vocabulary"):
        gen.generate(char_lm, ["ROMEO"])
    (tmp_path / "no_newline.txt").write_text("abc")
    with pytest.raises(UserError, match="give --prompt"):
        gen.unconditional_start(CharTokenizer(str(tmp_path / "no_newline.txt")))
    with pytest.raises(UserError, match="not both"):
        gen.read_prompts(["a"], "file.txt")
    with pytest.raises(UserError, match="prompt_file"):
        gen.read_prompts(None, str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="backslash"):
        gen.unescape("ends with \\")
    assert gen.unescape("a\\n\\tb é") == "a\n\tb é"


# ----------------------------------------------------------------------------------------------
# The command, on a workdir trained by the real command
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tiny_gpt_workdir):
    """The session's 1-layer char GPT trained 10 steps by the real command (tests/conftest.py)."""
    return tiny_gpt_workdir


HEADER = re.compile(r"^----- prompt (\d+)/(\d+), sample (\d+)/(\d+) \((eos|stop|length)\) -----$", re.M)


def parse_output(stdout: str) -> list[tuple[tuple[int, int, str], str]]:
    """-> [((prompt, sample, reason), body)] from the command's output."""
    headers = list(HEADER.finditer(stdout))
    bodies = [stdout[h.end() + 1:(headers[i + 1].start() - 1 if i + 1 < len(headers) else len(stdout.rstrip("\n")))]
              for i, h in enumerate(headers)]
    return [((int(h[1]), int(h[3]), h[5]), body) for h, body in zip(headers, bodies)]


@pytest.mark.parametrize("settings, message", [
    ({"top_k": -3}, r"^top_k=-3 must be >= 0 \(0 = no top-k filter"),   # used to run silently as no top-k
    ({"top_p": 0.0}, r"^top_p=0\.0 must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"^top_p=1\.5 must be in \(0, 1\]"),
    ({"top_p": float("nan")}, r"^top_p=nan must be in \(0, 1\]"),
    ({"temperature": -0.5}, r"^temperature=-0\.5 must be >= 0"),
])
def test_sampling_settings_out_of_range_are_refused_when_made(settings, message):
    with pytest.raises(UserError, match=message):
        gen.Sampling(**settings)
    gen.Sampling(top_k=0, top_p=1.0, temperature=0.0)  # the "off" values stay valid


def test_max_new_tokens_beyond_what_a_run_can_hold_is_refused_before_decoding(char_lm):
    """10**10 used to end in a traceback from the decoding loop."""
    for bad in (10**10, gen.MAX_NEW_TOKENS + 1):
        with pytest.raises(UserError, match=rf"^max_new_tokens={bad} exceeds 1,000,000 tokens per sample"):
            gen.check_max_new_tokens(bad)
    with pytest.raises(UserError, match=r"max_new_tokens=10000000000 exceeds"):
        gen.generate_ids(char_lm.model, char_lm.params, [[1]], 10**10)
    gen.check_max_new_tokens(gen.MAX_NEW_TOKENS)


@pytest.mark.slow
def test_command_prints_every_sample_of_every_prompt(workdir, tmp_path):
    args = [f"--init={workdir}", "--prompt=ROMEO:", "--prompt=JULIET:\\nO", "--num_samples=2",
            "--max_new_tokens=40", "--seed=3"]
    printed = parse_output(run_module("pretrain.generate", args).stdout)
    assert [key[:2] for key, _ in printed] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for (prompt, _, reason), body in printed:
        start = "ROMEO:" if prompt == 1 else "JULIET:\nO"
        assert body.startswith(start) and reason == "length" and len(body) == len(start) + 40, body
    assert printed[0][1] != printed[1][1]

    # Greedy from a prompt file (prompt + 40 new tokens slide past the 32-token context): the library's text.
    (tmp_path / "prompts.txt").write_text("ROMEO:\n\nKING:\n")
    args = [f"--init={workdir}", f"--prompt_file={tmp_path / 'prompts.txt'}", "--greedy", "--max_new_tokens=40"]
    printed = parse_output(run_module("pretrain.generate", args).stdout)
    expected = gen.generate(load_language_model(workdir), ["ROMEO:", "KING:"], max_new_tokens=40,
                            sampling=gen.Sampling(greedy=True))
    assert [body for _, body in printed] == [c[0].prompt + c[0].text for c in expected]

    failed = run_module("pretrain.generate", [f"--init={tmp_path / 'nothing'}"], check=False)
    assert failed.returncode == 2 and failed.stderr.strip().count("\n") == 0 and "does not exist" in failed.stderr
