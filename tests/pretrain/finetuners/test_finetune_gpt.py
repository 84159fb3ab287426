"""GPT fine-tuning with a linear head on the last token (models/gpt_tasks.py, pretrain/finetuners/gpt.py):
parity with transformers' GPT2ForSequenceClassification, which token the head reads, the input format,
merging a pretrained GPT, freezing, and the real `pretrain.finetune` command on SST-2."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers

from configs import glue as glue_config
from models.convert.hf_gpt2 import hf_state_dict_from_gpt
from models.gpt import GPT, GPTConfig
from models.gpt_tasks import GPTForFineTuning
from objectives.task_heads import head_kind
from pretrain.data.tokenizers import CharTokenizer
from pretrain.finetuners import registry
from pretrain.finetuners.gpt import GPTFinetuner, LastTokenObjective
from pretrain.runtime.errors import UserError
from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue.task import GlueFineTuningTask
from pretrain.training import freezing, pretrained
from pretrain.training.train_state import unbox
from tests.helpers.commands import run_module
from tests.helpers.paths import SHARED_DATA
from tests.helpers.random_weights import gpt_random_params

CONFIG = GPTConfig(vocab_size=64, n_positions=32, d_model=32, num_layers=2, num_heads=4, d_ff=128,
                   dropout_rate=0.0, attention_dropout_rate=0.0)
PAD = 63                     # a pad id for transformers to find the padding by; never used in the rows
LENGTHS = (5, 12, 16, 9)     # right-padded to 16
TOLERANCE = 1e-4
SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
GLUE_DIR = os.path.join(SHARED_DATA, "glue")


def _rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids [4, 16] right-padded with PAD, input_mask [4, 16]) of rows of LENGTHS real tokens from 0..62.
    The first row ends with id 0, the char tokenizer's pad id, which is a real character there."""
    rng = np.random.default_rng(seed)
    width = max(LENGTHS)
    mask = (np.arange(width)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(0, PAD, (len(LENGTHS), width)), PAD).astype(np.int32)
    ids[0, LENGTHS[0] - 1] = 0
    return ids, mask


def _params(num_labels: int, seed: int = 0) -> dict:
    """Body with O(1) activations (tests/test_gpt.py) and a head whose logits are O(1)."""
    kernel = np.random.default_rng(seed + 1).standard_normal((CONFIG.d_model, num_labels)) / np.sqrt(CONFIG.d_model)
    return {"gpt": gpt_random_params(CONFIG, seed), "score": {"kernel": kernel.astype(np.float32)}}


def _forward(num_labels: int):
    model = GPTForFineTuning(CONFIG, head_kind("regression" if num_labels == 1 else "classification"), num_labels)
    return jax.jit(lambda params, ids, mask: model.apply({"params": params}, ids, mask)["logits"])


def _hf_classifier(params: dict, num_labels: int) -> transformers.GPT2ForSequenceClassification:
    """transformers' model with our weights: the body via the GPT-2 exporter, `score.weight` = kernel^T."""
    hf_config = transformers.GPT2Config(vocab_size=CONFIG.vocab_size, n_positions=CONFIG.n_positions,
                                        n_embd=CONFIG.d_model, n_layer=CONFIG.num_layers, n_head=CONFIG.num_heads,
                                        n_inner=CONFIG.d_ff, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                        num_labels=num_labels, pad_token_id=PAD)
    model = transformers.GPT2ForSequenceClassification(hf_config).eval()
    state = {k: torch.tensor(v) for k, v in hf_state_dict_from_gpt(params["gpt"], CONFIG).items()}
    state["score.weight"] = torch.tensor(params["score"]["kernel"].T.copy())
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    return model


# ---------------------------------------------------------------------------------------------
# The model against transformers, and the token it reads.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
def test_logits_and_loss_match_transformers(num_labels):
    params, (ids, mask) = _params(num_labels), _rows()
    ours = np.asarray(_forward(num_labels)(params, jnp.asarray(ids), jnp.asarray(mask)))
    hf = _hf_classifier(params, num_labels)
    labels = (np.array([0, 2, 1, 2]) if num_labels > 1 else np.array([0.5, 3.0, -1.0, 2.0], np.float32))
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids, dtype=torch.long), labels=torch.tensor(labels))
    assert ours.shape == (len(LENGTHS), num_labels) and np.abs(ours).max() > 0.5
    np.testing.assert_allclose(ours, out.logits.numpy(), atol=TOLERANCE, rtol=0)
    # Rows differ, so a head that read one shared position (or the padding) could not match.
    assert np.abs(ours - ours[:1]).max() > 0.1

    # The shared objective: cross entropy / MSE as transformers computes them.
    objective = LastTokenObjective("regression" if num_labels == 1 else "classification", num_labels)
    batch = {"label": jnp.asarray(labels), "weight": jnp.ones(len(LENGTHS))}
    loss, _ = objective.loss({"logits": jnp.asarray(ours)}, batch)
    assert float(loss) == pytest.approx(float(out.loss), abs=1e-5)


def test_head_reads_each_rows_last_real_token():
    params, (ids, mask) = _params(2), _rows(seed=1)
    forward = _forward(2)
    base = np.asarray(forward(params, jnp.asarray(ids), jnp.asarray(mask)))

    # Other padding tokens (as another pad id writes them): nothing changes.
    other_padding = np.where(mask == 1, ids, np.random.default_rng(2).integers(0, 64, ids.shape)).astype(np.int32)
    np.testing.assert_allclose(np.asarray(forward(params, jnp.asarray(other_padding), jnp.asarray(mask))), base,
                               atol=1e-6, rtol=0)

    # Each row is the body's last hidden state of that row alone, unpadded, times the head: also the first
    # row, whose last real token is id 0 (a pad id for the char tokenizer, which a pad-id search would skip).
    padded = np.asarray(forward(params, jnp.asarray(ids), jnp.asarray(mask)))
    for row, length in enumerate(LENGTHS):
        hidden = GPT(CONFIG).apply({"params": params["gpt"]}, jnp.asarray(ids[row:row + 1, :length]),
                                   method=GPT.hidden_states)                                  # [1, length, D]
        np.testing.assert_allclose(padded[row], np.asarray(hidden[0, -1]) @ params["score"]["kernel"],
                                   atol=1e-5, rtol=0)

    # Changing a row's last real token changes that row's output.
    rows, last = np.arange(len(LENGTHS)), np.array(LENGTHS) - 1
    changed = ids.copy()
    changed[rows, last] = (ids[rows, last] + 7) % PAD
    moved = np.asarray(forward(params, jnp.asarray(changed), jnp.asarray(mask)))
    assert (np.abs(moved - padded).max(axis=-1) > 1e-3).all()


# ---------------------------------------------------------------------------------------------
# The finetuner: input format, merging a pretrained GPT, freezing.
# ---------------------------------------------------------------------------------------------
class _EosTokenizer:
    """A word-level stand-in with an end-of-sequence id (GPT-2's BPE has <|endoftext|>)."""
    eos_id, pad_id, vocab_size = 1, 1, 100

    def encode_batch(self, texts):
        return [[10 + len(w) for w in t.split()] for t in texts]


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory) -> CharTokenizer:
    path = tmp_path_factory.mktemp("chars") / "chars.txt"
    path.write_text("abcdefghijklmnopqrstuvwxyz .,'\n")
    return CharTokenizer(str(path))


def _config(max_seq_length: int = 16, strategy: str = "none") -> ml_collections.ConfigDict:
    c = glue_config.get_config(f"task=mrpc,model=gpt,freeze={strategy}")
    c.unlock()
    c.model.update(vocab_size=CONFIG.vocab_size, n_positions=CONFIG.n_positions, d_model=CONFIG.d_model,
                   num_layers=CONFIG.num_layers, num_heads=CONFIG.num_heads, d_ff=CONFIG.d_ff)
    c.data.max_seq_length = max_seq_length
    return c


def _examples(*pairs) -> list[glue.Example]:
    return [glue.Example(text_a=a, text_b=b, label=0, idx=i) for i, (a, b) in enumerate(pairs)]


def test_pair_inputs_are_separated_and_end_with_eos(char_tokenizer):
    mrpc, sst2 = glue.get_task("mrpc"), glue.get_task("sst2")
    finetuner = GPTFinetuner(_config(max_seq_length=9), mrpc, _EosTokenizer())
    # EOS separates and ends: a (2 words) + eos + b + eos; the longer text is cut first to fit 9.
    (ids, segments), (long_ids, _) = finetuner.features(_examples(("ab c", "d"), ("a b c d e f", "g h")))
    assert ids == [12, 11, 1, 11, 1] and segments == [0, 0, 1, 1, 1]
    assert long_ids == [11, 11, 11, 11, 11, 1, 11, 11, 1]
    single = GPTFinetuner(_config(max_seq_length=4), sst2, _EosTokenizer()).features(_examples(("a b c d", None)))
    assert single[0][0] == [11, 11, 11, 1]

    # No EOS (the char vocabulary): a newline separates, nothing is appended.
    finetuner = GPTFinetuner(_config(max_seq_length=6), mrpc, char_tokenizer)
    (ids, _), = finetuner.features(_examples(("abcd", "xyz")))
    assert char_tokenizer.decode(ids) == "abc\nxy"
    data = finetuner.encode(_examples(("ab", "c"), ("abcd", "xyz")), batch_size=2)
    batch = data.batch(np.arange(2))
    # The mask comes from the lengths: pad id 0 is '\n' here, the separator itself.
    assert char_tokenizer.pad_id == char_tokenizer.encode("\n")[0]
    np.testing.assert_array_equal(batch["input_mask"].sum(-1), [4, 6])
    assert set(LastTokenObjective("classification", 2).model_inputs(batch)) == {"input_ids", "input_mask"}


def test_context_longer_than_the_model_is_a_user_error(char_tokenizer):
    finetuner = registry.for_config(_config(max_seq_length=64), GlueFineTuningTask.named("sst2"), char_tokenizer)
    assert isinstance(finetuner, GPTFinetuner)
    with pytest.raises(UserError, match="max_seq_length=64 exceeds the model's 32 positions"):
        finetuner.check()


def test_merge_pretrained_keeps_the_body_bitwise_and_lists_only_the_head(char_tokenizer):
    finetuner = GPTFinetuner(_config(), glue.get_task("sst2"), char_tokenizer)
    model = finetuner.build_model()
    ids = jnp.ones((1, 8), jnp.int32)
    fresh_params = unbox(jax.jit(model.init)(jax.random.key(0), ids, ids)["params"])
    body = gpt_random_params(CONFIG, seed=3)
    init = pretrained.Pretrained("gpt", {}, body, {}, "orbax:test")
    merged, fresh = finetuner.merge_pretrained(fresh_params, init)
    assert fresh == ["score/kernel"]
    for ours, theirs in zip(jax.tree.leaves(merged["gpt"]), jax.tree.leaves(body), strict=True):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    np.testing.assert_array_equal(merged["score"]["kernel"], fresh_params["score"]["kernel"])
    assert jax.tree.structure(merged) == jax.tree.structure(fresh_params)


@pytest.mark.parametrize("strategy", ["head_only", "lowest", "gradual"])
def test_freezing_strategies_name_the_gpt_body(char_tokenizer, strategy):
    """head_only: only `score` trains. lowest (1 layer): both embedding tables and layer_0 stay frozen.
    gradual: the head and final LayerNorm with the top layer, one more layer per epoch downwards, the
    embeddings last (pretrain/training/freezing.py)."""
    config = _config(strategy=strategy)
    config.freezing.num_frozen_layers = 1
    finetuner = GPTFinetuner(config, glue.get_task("sst2"), char_tokenizer)
    ids = jnp.ones((1, 8), jnp.int32)
    params = unbox(jax.eval_shape(finetuner.build_model().init, jax.random.key(0), ids, ids)["params"])
    starts = freezing.unfreeze_steps(params, finetuner.config.freezing, num_layers=finetuner.num_layers,
                                     steps_per_epoch=5)
    body = starts["gpt"]
    assert set(jax.tree.leaves(starts["score"])) == {0}
    if strategy == "head_only":
        assert set(jax.tree.leaves(body)) == {freezing.NEVER}
        return
    if strategy == "lowest":
        frozen = [body["token_embedding"], body["position_embedding"], body["layer_0"]]
        assert set(jax.tree.leaves(frozen)) == {freezing.NEVER}
        assert set(jax.tree.leaves([body["layer_1"], body["final_norm"]])) == {0}
        return
    assert set(jax.tree.leaves(body["final_norm"])) == {0}
    assert [set(jax.tree.leaves(body[f"layer_{i}"])) for i in range(2)] == [{5}, {0}]
    assert set(jax.tree.leaves([body["token_embedding"], body["position_embedding"]])) == {10}


# ---------------------------------------------------------------------------------------------
# The real commands: pretrain a tiny GPT, fine-tune it on SST-2.
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_gpt_workdir(char_gpt_glue_workdir) -> str:
    """A 1-layer char GPT pretrained by `pretrain.train` on tinyshakespeare whose vocabulary also holds SST-2's
    characters, which shakespeare's 65 do not (the session's, tests/conftest.py, shared with the few-shot
    command's test)."""
    return char_gpt_glue_workdir


@pytest.mark.slow
def test_finetune_command_on_sst2_from_a_pretrained_gpt(tmp_path, tiny_gpt_workdir):
    """The loop runs and learns: the training loss falls over 4 epochs of 320 examples. A 32-wide model
    learns little under dropout 0.1, so dropout is off; 64 = the pretrained model's context."""
    workdir = tmp_path / "sst2"
    proc = run_module("pretrain.finetune", [
        "--config=configs/glue.py:task=sst2,model=gpt", f"--workdir={workdir}", f"--config.init={tiny_gpt_workdir}",
        f"--config.data.glue_dir={GLUE_DIR}", "--config.data.max_train_examples=320", "--config.num_epochs=4",
        "--config.data.max_seq_length=64", "--config.optimizer.learning_rate=3e-3", "--config.log_every=5",
        "--config.model.dropout_rate=0", "--config.model.attention_dropout_rate=0",
        "--config.model.classifier_dropout=0"])
    assert "freshly initialised: score/kernel" in proc.stdout
    results = json.loads((workdir / "results.json").read_text())
    accuracy = results["metrics"]["dev"]["accuracy"]
    assert results["task"] == "sst2" and 0.0 <= accuracy <= 1.0
    assert results["init"].startswith("orbax:")
    losses = [e["train_loss"] for e in results["epochs"]]
    assert losses[-1] < losses[0] - 0.02, losses
    rows = (workdir / "predictions" / "dev.tsv").read_text().splitlines()
    assert len(rows) == 1 + 872


@pytest.mark.slow
def test_lora_finetuned_gpt_loads_as_a_language_model(tmp_path, tiny_gpt_workdir):
    """pretrain.generate / perplexity / fewshot load a GPT fine-tuned with LoRA as base + the trained weights
    (pretrain/lm/language_model.py): its next-token scores are those of the base with the LoRA merged in."""
    from models import peft
    from pretrain.lm.language_model import load_language_model, next_token_log_probs
    from pretrain.loops import finetuning
    config = glue_config.get_config("task=sst2,model=gpt,peft=lora")
    config.init, config.data.glue_dir = tiny_gpt_workdir, GLUE_DIR
    config.data.max_train_examples, config.data.max_seq_length, config.num_epochs = 64, 64, 1
    config.peft.lora.targets, config.peft.lora.rank = "query,value,intermediate", 4
    config.write_test_predictions = False
    workdir = tmp_path / "sst2_lora"
    finetuning.finetune(config, str(workdir))

    adapted, base = load_language_model(str(workdir)), load_language_model(tiny_gpt_workdir)
    assert adapted.peft.method == "lora" and base.peft.method == "none"
    lora_b = [x for path, x in jax.tree_util.tree_flatten_with_path(adapted.params)[0] if "lora_b" in str(path)]
    assert len(lora_b) == 3 and all(np.any(np.asarray(b)) for b in lora_b)  # trained, so the scores move
    ids = jnp.asarray([adapted.tokenizer.encode("it is a good film, and a fine one.")])
    merged = peft.merge_lora(jax.device_get(adapted.params), config.peft.lora.alpha / config.peft.lora.rank)
    ours = next_token_log_probs(adapted.model, adapted.params, ids)
    np.testing.assert_allclose(ours, next_token_log_probs(base.model, merged, ids), atol=1e-5)
    assert np.abs(np.asarray(ours) - np.asarray(next_token_log_probs(base.model, base.params, ids))).max() > 1e-4
