"""Where pretraining text comes from: `load_documents` (config.data -> tokenized train and held-out documents,
or a prepared corpus read by random access). The batches built from them are pretrain/data/streaming.py's;
pretrain/data/prefetch.py builds them ahead of the device."""
from __future__ import annotations

import itertools

import ml_collections
import numpy as np

from models.registry import Registry
from pretrain.data import hub, prepared, sources, staging, tokenizers
from pretrain.training import config_keys
from pretrain.training.config_keys import BOOLEAN, number
from pretrain.workdir import storage


# config.data.source -> (config.data, tokenizer) -> (train, eval) documents, each source registered beside it with
# the keys it reads (config_keys.declare); load_documents looks the source up by name. Only a pretraining config
# (one with an objective) chooses among these: a fine-tuning config's data.source names where its task's files are.
SOURCES = config_keys.chosen_by("data.source", Registry("data source", "config.data.source", sources.CorpusError),
                                within="objective")


def load_documents(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                   ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """config.data -> (train, eval) tokenized documents (or corpora read by random access or as they stream), from
    the source config.data.source names."""
    return SOURCES.get(config.source)(config, tokenizer)


@config_keys.declare(SOURCES, "text")
def text_corpus(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer):
    """Text files: one sentence per line, blank lines between documents."""
    if not config.path:
        raise sources.CorpusError("config.data.path is empty: give --config.data.path=FILE "
                                  "(one sentence per line, blank lines between documents)")
    return _tokenized_with_held_out(config, tokenizer, sources.read_text_corpus(config.path))


@config_keys.declare(SOURCES, "tfds")
def tfds_corpus(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer):
    """A TensorFlow Datasets corpus (config.data.tfds_name, its split and text key)."""
    if not config.tfds_name:
        raise sources.CorpusError("config.data.tfds_name is empty: give e.g. "
                                  "--config.data.tfds_name=wikipedia/20230601.en")
    docs = sources.read_tfds_corpus(
        config.tfds_name, split=config.tfds_split, data_dir=config.tfds_data_dir or None,
        text_key=config.text_key, max_documents=config.max_documents or None)
    return _tokenized_with_held_out(config, tokenizer, docs)


@config_keys.declare(SOURCES, "hf", streaming=BOOLEAN)
def hub_corpus(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer):
    """A Hugging Face Hub dataset: read as it streams (streaming, no max_documents), or read into memory."""
    if config.get("streaming", False) and not config.max_documents:
        return _streamed_corpus(config, tokenizer)
    return _tokenized_with_held_out(config, tokenizer, _hub_documents(config))


def _tokenized_with_held_out(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer,
                             docs: list[sources.Document]) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """The first max_documents (if set) tokenized; the last `eval_documents` of them held out."""
    if config.max_documents:
        docs = docs[:config.max_documents]
    tokenized = sources.tokenize_documents(docs, tokenizer)
    n_eval = config.eval_documents
    if n_eval and len(tokenized) - n_eval < 2:
        raise sources.CorpusError(f"corpus has {len(tokenized)} documents, too few to hold out "
                                  f"config.data.eval_documents={n_eval}; lower it or add text")
    return (tokenized[:-n_eval], tokenized[-n_eval:]) if n_eval else (tokenized, [])


def _hub_documents(config: ml_collections.ConfigDict) -> list[sources.Document]:
    """A Hugging Face Hub dataset's documents (pretrain/data/hub.py), read into memory as a text corpus is (a
    streamed one up to max_documents): every process reads them all, and the streaming pipeline gives each its
    rows."""
    _require_hf_path(config)
    documents = hub.iter_documents(config.hf_path, name=config.hf_name, split=config.hf_split,
                                   data_files=config.data_files, streaming=config.streaming,
                                   text_column=config.text_column)
    docs = list(itertools.islice(documents, config.max_documents or None))
    if not docs:
        raise sources.CorpusError(f"the dataset {config.hf_path!r} split {config.hf_split!r} has no text in column "
                                  f"{config.text_column!r} (check --config.data.hf_split and text_column)")
    return docs


def _require_hf_path(config: ml_collections.ConfigDict) -> None:
    if not config.hf_path:
        raise sources.CorpusError("config.data.hf_path is empty: give a Hub name (--config.data.hf_path="
                                  "wikimedia/wikipedia --config.data.hf_name=20231101.en) or a local folder")


def _streamed_corpus(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                     ) -> tuple[hub.StreamedCorpus, list[list[np.ndarray]]]:
    """A Hub dataset read as it streams (pretrain/data/streamed.py), and its held-out documents: the first
    eval_documents of hf_eval_split, in memory (a stream has no end to hold out)."""
    _require_hf_path(config)
    corpus = hub.StreamedCorpus(config.hf_path, tokenizer, name=config.hf_name, split=config.hf_split,
                                data_files=config.data_files, text_column=config.text_column)
    if not config.eval_documents:
        return corpus, []
    if not config.hf_eval_split:
        raise sources.CorpusError(f"config.data.eval_documents={config.eval_documents} with a streamed corpus: set "
                                  "--config.data.hf_eval_split to the split they come from (e.g. validation), "
                                  "or eval_documents=0")
    held_out = hub.iter_documents(config.hf_path, name=config.hf_name, split=config.hf_eval_split,
                                  data_files=config.data_files, streaming=True, text_column=config.text_column)
    return corpus, sources.tokenize_documents(list(itertools.islice(held_out, config.eval_documents)), tokenizer)


@config_keys.declare(SOURCES, "prepared")
def prepared_documents(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                        ) -> tuple[prepared.PreparedCorpus, prepared.PreparedCorpus | list]:
    """A directory of pretrain.tools.prepare_corpus: its train split, and its eval split if it has one (without one,
    the train split's last data.eval_documents are held out, as a text corpus's are). Both are read by random access;
    neither is loaded into memory."""
    if not config.path:
        raise sources.CorpusError("config.data.path is empty: give --config.data.path=DIR, a directory written by "
                                  "python -m pretrain.tools.prepare_corpus")
    if config.get("max_documents", 0):
        raise sources.CorpusError("config.data.max_documents does not apply to a prepared corpus: prepare a "
                                  "smaller one with python -m pretrain.tools.prepare_corpus --max_documents")
    directory = staging.stage(config.path, prepared.INDEX) if storage.is_url(config.path) else config.path
    train = prepared.PreparedCorpus.open(directory, "train", tokenizer=tokenizer)
    if "eval" in train.index["splits"]:
        return train, prepared.PreparedCorpus.open(directory, "eval", tokenizer=tokenizer)
    if config.get("eval_documents", 0):  # no eval split prepared: the train split's last ones, as for text
        return train.hold_out(config.eval_documents)
    return train, []


@config_keys.declare(SOURCES, "raw_text", eval_fraction=number(0, 1, high_open=True, what="a number in [0, 1)"))
def raw_text_documents(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                       ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """The files verbatim (newlines included) as one character stream, the way nanoGPT prepares a corpus;
    `eval_fraction` holds out the stream's last characters (nanoGPT: 0.1), and train and eval are then one
    document each."""
    fraction = config.get("eval_fraction", 0.0)
    if not 0.0 <= fraction < 1.0:
        raise sources.CorpusError(f"config.data.eval_fraction={fraction} must be in [0, 1) (nanoGPT holds out 0.1)")
    if config.get("eval_documents", 0):
        raise sources.CorpusError("config.data.source='raw_text' is one stream: hold out text with "
                                  "--config.data.eval_fraction, not --config.data.eval_documents")
    text = sources.read_raw_text(config.path)
    parts = list(sources.split_tail(text, fraction)) if fraction else [text]
    tokenized = [[np.asarray(ids, np.int32)] for ids in tokenizer.encode_batch(parts)]
    return tokenized[0:1], tokenized[1:]
