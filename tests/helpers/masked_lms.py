"""Runs without training for the scoring tests: a workdir whose checkpoint is given params (Orbax's reader patched),
masked LMs' random weights far from a uniform prediction, and a small lowercased WordPiece vocabulary."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from pretrain.training.train_state import unbox
from tests.helpers.modernbert import training_texts, write_modernbert_tokenizer


def fake_run(directory, config, params, monkeypatch) -> str:
    """A workdir with `config` whose checkpoint is `params` at step 5 (restore_params patched: no Orbax run)."""
    from pretrain.workdir import checkpoints

    os.makedirs(os.path.join(directory, "checkpoints"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(config.to_json())
    monkeypatch.setattr(checkpoints, "restore_params", lambda directory, step=None: (params, 5))
    return str(directory)


def random_params(config, seed: int) -> dict:
    """The family's initialiser with the embeddings scaled up, so that the MLM's distribution is far from uniform."""
    from models import build_model

    ids = jnp.ones((1, 8), jnp.int32)
    masked = (ids[:, :2],)  # the masked positions; ELECTRA also reads their ids and weights
    masked += (ids[:, :2], jnp.ones((1, 2))) if config.model.name == "electra" else ()
    params = unbox(build_model(config.model).init(jax.random.key(seed), ids, jnp.zeros_like(ids), ids,
                                                   *masked))["params"]
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x * 4 if "word_embeddings" in jax.tree_util.keystr(path) else x, params)


def wordpiece_vocab(path) -> str:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(training_texts(), trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    path.write_text("".join(piece + "\n" for piece, _ in vocab))
    return str(path)


def masked_run(tmp_path_factory, family: str, seed: int):
    """(its folder, a tiny `family` pretraining config with a small tokenizer, random weights)."""
    import importlib

    root = tmp_path_factory.mktemp(f"pll_{family}")
    config = importlib.import_module(f"configs.{family}").get_config("size=tiny")
    if family == "modernbert":  # its tokenizer.json, cased
        spec = dict(kind="hf_json", path=write_modernbert_tokenizer(str(root / "tok"), 300), lowercase=False)
    elif family == "albert":  # ALBERT's SentencePiece model, exported as spiece.model
        from pretrain.tools.train_tokenizer import train_sentencepiece
        (root / "corpus.txt").write_text("\n".join(training_texts()))
        spec = dict(kind="sentencepiece", path=train_sentencepiece(str(root / "corpus.txt"), str(root / "spm"), 400),
                    lowercase=True)
    else:
        spec = dict(kind="wordpiece", path=wordpiece_vocab(root / "vocab.txt"), lowercase=True)
    config.tokenizer.update(spec)
    config.model.update(vocab_size=320 if family == "modernbert" else 400, max_position_embeddings=64)
    return root, config, random_params(config, seed=seed)
