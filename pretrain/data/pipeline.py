"""Deterministic, resumable pretraining batches: every batch is a pure function of (seed, step).

Per phase (sequence length) and data epoch, the objective makes a shuffled set of fixed-length
instances from the tokenized documents with an RNG seeded by (seed, phase, epoch); step k of the
phase reads examples k*B .. k*B+B-1 of that endless sequence of epochs. The objective then builds
the batch (e.g. dynamic masking) with an RNG seeded by (seed, step). Resuming at step s therefore
needs only s, which the checkpoint stores, and gives the same batches as an uninterrupted run.
"""
from __future__ import annotations

import functools
import queue
import threading
from typing import Any, Iterable, Iterator, NamedTuple

import ml_collections
import numpy as np

from objectives.interface import Objective, PhasedObjective
from pretrain.core import distributed
from pretrain.data import prepared, sources, tokenizers


def load_documents(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                   ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """config.data -> (train, eval) tokenized documents; the last `eval_documents` are held out.

    source 'raw_text' reads the files verbatim (newlines included) as one character stream, the way
    nanoGPT prepares a corpus; `eval_fraction` holds out the stream's last characters (nanoGPT: 0.1),
    and train and eval are then one document each.
    """
    if config.source == "raw_text":
        return _raw_text_documents(config, tokenizer)
    if config.source == "prepared":
        return _prepared_documents(config, tokenizer)
    if config.source == "text":
        if not config.path:
            raise sources.CorpusError("config.data.path is empty: give --config.data.path=FILE "
                                      "(one sentence per line, blank lines between documents)")
        docs = sources.read_text_corpus(config.path)
    elif config.source == "tfds":
        if not config.tfds_name:
            raise sources.CorpusError("config.data.tfds_name is empty: give e.g. "
                                      "--config.data.tfds_name=wikipedia/20230601.en")
        docs = sources.read_tfds_corpus(
            config.tfds_name, split=config.tfds_split, data_dir=config.tfds_data_dir or None,
            text_key=config.text_key, max_documents=config.max_documents or None)
    else:
        raise sources.CorpusError(f"config.data.source={config.source!r} is unknown; use 'text', 'raw_text', "
                                  "'tfds' or 'prepared'")
    if config.max_documents:
        docs = docs[:config.max_documents]
    tokenized = sources.tokenize_documents(docs, tokenizer)
    n_eval = config.eval_documents
    if n_eval and len(tokenized) - n_eval < 2:
        raise sources.CorpusError(f"corpus has {len(tokenized)} documents, too few to hold out "
                                  f"config.data.eval_documents={n_eval}; lower it or add text")
    return (tokenized[:-n_eval], tokenized[-n_eval:]) if n_eval else (tokenized, [])


def _prepared_documents(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                        ) -> tuple[prepared.PreparedCorpus, prepared.PreparedCorpus | list]:
    """A directory of scripts/prepare_corpus.py: its train split, and its eval split if it has one. Both are
    read by random access; neither is loaded into memory."""
    if not config.path:
        raise sources.CorpusError("config.data.path is empty: give --config.data.path=DIR, a directory written by "
                                  "scripts/prepare_corpus.py")
    if config.get("max_documents", 0):
        raise sources.CorpusError("config.data.max_documents does not apply to a prepared corpus: prepare a "
                                  "smaller one with scripts/prepare_corpus.py --max_documents")
    train = prepared.PreparedCorpus.open(config.path, "train", tokenizer=tokenizer)
    if "eval" in train.index["splits"]:
        return train, prepared.PreparedCorpus.open(config.path, "eval", tokenizer=tokenizer)
    if config.get("eval_documents", 0):
        raise sources.CorpusError(f"prepared corpus {config.path} has no eval split but config.data.eval_documents="
                                  f"{config.eval_documents}: prepare it with --eval_documents=K or set 0")
    return train, []


def _raw_text_documents(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer
                        ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
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


class Phase(NamedTuple):
    start_step: int
    seq_length: int
    objective: Objective


class PretrainingData:
    """Batches for step s: `batch(s)` -> dict of numpy arrays with a leading batch dimension.

    `batch_size` is the global batch; `batch(s)` returns this process's rows of it (all of them in a
    single-process run; `distributed.process_rows`, with `micro_batches` = the gradient accumulation
    steps). process_index / process_count default to JAX's.
    """

    def __init__(self, documents: list[list[np.ndarray]], objective: Objective, *, batch_size: int, seed: int,
                 max_seq_length: int, long_seq_length: int = 0, long_seq_start_step: int = 0,
                 micro_batches: int = 1, process_index: int | None = None, process_count: int | None = None):
        self.documents = documents
        self.batch_size = batch_size
        self.seed = seed
        self.rows = distributed.process_rows(batch_size, micro_batches=micro_batches, process_index=process_index,
                                             process_count=process_count)
        # Phases: (first step, sequence length, objective). BERT trains at 128 and switches to 512
        # late, masking more positions there (its PhasedObjective.for_long_phase).
        self.phases = [Phase(0, max_seq_length, objective)]
        if long_seq_length:
            long_objective = objective.for_long_phase() if isinstance(objective, PhasedObjective) else objective
            self.phases.append(Phase(long_seq_start_step, long_seq_length, long_objective))

    def phase(self, step: int) -> int:
        return max(i for i, p in enumerate(self.phases) if step >= p.start_step)

    @functools.lru_cache(maxsize=3)
    def _created(self, phase: int, epoch: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, phase, epoch])
        p = self.phases[phase]
        return p.objective.create_instances(self.documents, rng, p.seq_length)

    @functools.lru_cache(maxsize=None)
    def epoch_size(self, phase: int) -> int:
        """Kept apart from `_created`'s small cache: it is read every step and must never recompute."""
        return len(self._created(phase, 0)["input_ids"])

    @functools.lru_cache(maxsize=2)
    def _epoch(self, phase: int, epoch: int) -> dict[str, np.ndarray]:
        instances = self._created(phase, epoch)
        # Every epoch has the size of epoch 0 (instance counts vary by ~1% with the random pair
        # lengths) so that the position of step s is arithmetic, not a replay of all epochs.
        index = np.arange(self.epoch_size(phase)) % len(instances["input_ids"])
        return {k: v[index] for k, v in instances.items()}

    def position(self, step: int) -> dict:
        """Where step `step` reads from; stored in checkpoints for inspection and checks."""
        phase = self.phase(step)
        first = (step - self.phases[phase].start_step) * self.batch_size
        epoch, index = divmod(first, self.epoch_size(phase))
        return {"step": step, "phase": phase, "seq_length": self.phases[phase].seq_length,
                "epoch": epoch, "index_in_epoch": index, "seed": self.seed}

    def instances(self, step: int) -> dict[str, np.ndarray]:
        phase = self.phase(step)
        size = self.epoch_size(phase)
        examples = (step - self.phases[phase].start_step) * self.batch_size + np.arange(self.batch_size)
        epochs, index = np.divmod(examples, size)
        parts = [{k: v[index[epochs == e]] for k, v in self._epoch(phase, int(e)).items()}
                 for e in np.unique(epochs)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of the global batch of `step`. Every process builds the whole batch (the
        masking RNG runs over all of it) and keeps its slice, so the global batch is the same whatever
        the number of processes."""
        phase = self.phase(step)
        rng = np.random.default_rng([self.seed, step, 1 << 20])
        full = self.phases[phase].objective.make_batch(self.instances(step), rng)
        return {k: v[self.rows] for k, v in full.items()}


def prefetch(make_batch, steps: range, size: int = 2) -> Iterator[tuple[int, Any]]:
    """(step, make_batch(step)) built on a host thread `size` steps ahead, so the device never waits on numpy."""
    return prefetch_iterator(((s, make_batch(s)) for s in steps), size)


def prefetch_iterator(items: Iterable, size: int = 2) -> Iterator:
    """The items of `items`, produced on a host thread up to `size` ahead; errors surface in the consumer."""
    if size <= 0:
        yield from items
        return
    buffer: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for item in items:
                if stop.is_set():
                    return
                buffer.put((item, None))
        except BaseException as e:  # surface errors in the consumer, not as a silent dead thread
            buffer.put((done, e))
        buffer.put((done, None))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item, error = buffer.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
