"""The pretraining side's extension points register one way: a synthetic optimizer, tokenizer, data source and
freezing strategy, each a module written to a temporary folder with one decorator (config_keys.declare) beside its
definition, and every reader picks it up: make_optimizer, load_tokenizer / from_config, load_documents, the
fine-tuning loop's freezing, and validation, which accepts each name and checks each declared key's range."""
from __future__ import annotations

import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import glue
from models.bert import BertConfig
from models.bert_tasks import BertForFineTuning
from objectives.task_heads import head_kind
from pretrain.data import documents, tokenizers
from pretrain.loops import finetuning
from pretrain.runtime.errors import ConfigError
from pretrain.training import freezing, optimizers, train_state, validation


def import_module(folder, monkeypatch, name: str, source: str, *registries) -> types.ModuleType:
    """`source` as the module `name` in `folder`, imported for this test only: `registries` get back their entries
    of before the import when the test ends."""
    for registry in registries:
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return __import__(name)


def refused(config: ml_collections.ConfigDict, key: str, value, allowed: str) -> None:
    """check_ranges fails on config.`key`=`value` with one line naming the key, the value and `allowed`."""
    with pytest.raises(ConfigError) as info:
        validation.check_ranges(config)
    message = str(info.value)
    assert "\n" not in message and f"config.{key}={value!r}" in message and allowed in message, message


# ----- An optimizer -----
SGD = """
    import optax
    from pretrain.training import config_keys, optimizers

    @config_keys.declare(optimizers.OPTIMIZERS, "plain_sgd", momentum=config_keys.number(0, 1, high_open=True))
    def plain_sgd(config, schedule):
        return optax.sgd(schedule, momentum=config.get("momentum", 0.0) or None)
"""


def sgd_config(**overrides) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"optimizer": dict(dict(
        name="plain_sgd", schedule="constant", learning_rate=0.5, warmup_steps=0, grad_clip_norm=0.0), **overrides)})


def test_a_registered_optimizer_is_built_by_make_optimizer_and_validated(tmp_path, monkeypatch):
    refused(sgd_config(), "optimizer.name", "plain_sgd", "one of 'adamw', 'adafactor', 'lamb'")
    import_module(tmp_path, monkeypatch, "plain_sgd_module", SGD, optimizers.OPTIMIZERS)
    config = sgd_config()
    validation.check_ranges(config)
    tx = optimizers.make_optimizer(config.optimizer, num_train_steps=10)
    params, grads = {"w": jnp.ones(3)}, {"w": jnp.asarray([1.0, -2.0, 4.0])}
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -0.5 * grads["w"])  # one step of SGD at the constant rate
    refused(sgd_config(momentum=1.5), "optimizer.momentum", 1.5, "a number in [0, 1)")
    assert "plain_sgd" in optimizers.OPTIMIZERS.names()


# ----- A tokenizer -----
TOKENIZER = """
    from pretrain.data.tokenizers import TOKENIZERS
    from pretrain.data.tokenizers.gpt import CharTokenizer
    from pretrain.training import config_keys

    @config_keys.declare(TOKENIZERS, "folded_char", {"honours_case": True}, lowercase=config_keys.BOOLEAN)
    class FoldedCharTokenizer(CharTokenizer):
        '''The characters of a file, the text lowercased first where `lowercase`.'''
        def __init__(self, path, *, lowercase=True, extra_ids=0):
            super().__init__(path, extra_ids=extra_ids)
            self.lowercase = lowercase

        def encode(self, text):
            return super().encode(text.lower() if self.lowercase else text)
"""


def test_a_registered_tokenizer_is_loaded_by_from_config_and_validated(tmp_path, monkeypatch):
    vocabulary = tmp_path / "chars.txt"
    vocabulary.write_text("abcABC ")
    config = ml_collections.ConfigDict({"tokenizer": dict(kind="folded_char", path=str(vocabulary), lowercase=True,
                                                          extra_ids=0)})
    refused(config, "tokenizer.kind", "folded_char", "one of 'sentencepiece', 'wordpiece'")
    import_module(tmp_path, monkeypatch, "folded_char_module", TOKENIZER, tokenizers.TOKENIZERS)
    validation.check_ranges(config)
    folded = tokenizers.from_config(config.tokenizer)
    assert type(folded).__name__ == "FoldedCharTokenizer" and folded.encode("AB") == folded.encode("ab")
    cased = tokenizers.load_tokenizer("folded_char", str(vocabulary), lowercase=False)
    assert cased.encode("AB") != cased.encode("ab")
    assert cased.load_options["lowercase"] is False  # honours_case: the option counts in the fingerprint
    assert tokenizers.fingerprint(cased) != tokenizers.fingerprint(folded)
    refused(ml_collections.ConfigDict({"tokenizer": dict(config.tokenizer, lowercase="yes")}), "tokenizer.lowercase",
            "yes", "one of True, False")
    refused(ml_collections.ConfigDict({"tokenizer": dict(config.tokenizer, extra_ids=-1)}), "tokenizer.extra_ids",
            -1, "an integer >= 0")  # the key every kind shares


# ----- A data source -----
SOURCE = """
    import numpy as np
    from pretrain.data import documents
    from pretrain.training import config_keys

    @config_keys.declare(documents.SOURCES, "repeated", copies=config_keys.POSITIVE)
    def repeated(config, tokenizer):
        '''config.text, tokenized, as `copies` training documents of one sentence; nothing held out.'''
        return [[np.asarray(tokenizer.encode(config.text), np.int32)]] * config.copies, []
"""


def test_a_registered_data_source_is_read_by_load_documents_and_validated(tmp_path, monkeypatch):
    vocabulary = tmp_path / "chars.txt"
    vocabulary.write_text("abc ")
    tokenizer = tokenizers.load_tokenizer("char", str(vocabulary))
    config = ml_collections.ConfigDict({"objective": {}, "data": dict(source="repeated", text="abc cab", copies=3)})
    refused(config, "data.source", "repeated", "one of 'text', 'tfds', 'hf', 'prepared', 'raw_text'")
    import_module(tmp_path, monkeypatch, "repeated_source_module", SOURCE, documents.SOURCES)
    validation.check_ranges(config)
    train, held_out = documents.load_documents(config.data, tokenizer)
    assert len(train) == 3 and held_out == [] and train[0][0].tolist() == tokenizer.encode("abc cab")
    refused(ml_collections.ConfigDict({"objective": {}, "data": dict(config.data, copies=0)}), "data.copies", 0,
            "a positive integer")


# ----- A freezing strategy -----
STRATEGY = """
    from pretrain.training import config_keys, freezing

    @config_keys.declare(freezing.FREEZING, "embeddings_later", {"layer_by_layer": False},
                         embeddings_from=config_keys.NON_NEGATIVE)
    def embeddings_later(config, *, num_layers, shared, steps_per_epoch):
        '''Every layer trains from the start, the embeddings from step embeddings_from.'''
        return lambda part, body: config.embeddings_from if part in body.embeddings else 0
"""


def test_a_registered_freezing_strategy_freezes_in_the_fine_tuning_loop_and_is_validated(tmp_path, monkeypatch):
    config = glue.get_config("task=mrpc")
    config.unlock()
    config.freezing = ml_collections.ConfigDict(dict(strategy="embeddings_later", embeddings_from=2))
    refused(config, "freezing.strategy", "embeddings_later", "one of 'none', 'head_only', 'lowest', 'gradual'")
    import_module(tmp_path, monkeypatch, "embeddings_later_module", STRATEGY, freezing.FREEZING)
    validation.check_ranges(config)
    validation.check_relations(config)
    model = BertForFineTuning(BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                                         intermediate_size=32, max_position_embeddings=16),
                              head_kind("classification"), 3)
    ids = jnp.ones((2, 8), jnp.int32)
    params = train_state.unbox(model.init(jax.random.key(0), ids, jnp.zeros_like(ids), jnp.ones_like(ids))["params"])
    finetuner = types.SimpleNamespace(num_layers=2, name="bert")
    tx, _, unfreeze_at, _ = finetuning.make_optimizer(config, params, steps_per_epoch=4, finetuner=finetuner)
    assert unfreeze_at["bert"]["embeddings"]["word_embeddings"]["embedding"] == 2
    assert unfreeze_at["bert"]["layer_0"]["attention"]["query"]["kernel"] == 0
    grads = jax.tree.map(jnp.ones_like, params)
    state = tx.init(params)
    for step in range(3):
        updates, state = tx.update(grads, state, params)
        embedding_moves = bool(np.any(updates["bert"]["embeddings"]["word_embeddings"]["embedding"]))
        assert embedding_moves == (step >= 2), step  # frozen for its first two steps, then trained
    config.freezing.embeddings_from = -1
    refused(config, "freezing.embeddings_from", -1, "an integer >= 0")
