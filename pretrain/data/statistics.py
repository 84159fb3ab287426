"""What a pretraining run is about to read, printed before it compiles: documents, sentences, tokens, the
share of unknown tokens, and how many passes over the data the run's steps make.

A high unknown share is the usual sign of a tokenizer trained on other text (or a lowercasing mismatch):
the model would learn to predict <unk>. A prepared corpus (pretrain/data/prepared.py) is counted from its
index and a sample of its documents, never read whole.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import ml_collections
import numpy as np

from pretrain.data.tokenizers import CharTokenizer, GPT2BPETokenizer

HIGH_UNKNOWN_SHARE = 0.01  # above this, the tokenizer does not fit the corpus
SAMPLE_DOCUMENTS = 2000    # documents read to estimate the unknown share of a corpus on disk


@dataclasses.dataclass(frozen=True)
class CorpusStatistics:
    documents: int
    sentences: int | None     # None: not counted (a prepared corpus's index holds documents and tokens)
    tokens: int
    unknown_share: float | None  # None: the tokenizer has no unknown token (byte-level BPE, characters)


def of_corpus(documents: Sequence[list[np.ndarray]], tokenizer) -> CorpusStatistics:
    """documents: lists of token-id arrays (one per sentence), in memory or a PreparedCorpus."""
    counted = getattr(documents, "num_tokens", None)
    sample = documents if counted is None else [documents[i] for i in _sample(len(documents))]
    lengths = [len(sentence) for document in sample for sentence in document]
    unknown = None
    if not isinstance(tokenizer, (GPT2BPETokenizer, CharTokenizer)):
        unk = tokenizer.unk_id
        unknown = sum(int(np.count_nonzero(s == unk)) for d in sample for s in d) / max(sum(lengths), 1)
    return CorpusStatistics(documents=len(documents), sentences=len(lengths) if counted is None else None,
                            tokens=sum(lengths) if counted is None else int(counted), unknown_share=unknown)


def _sample(n: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, SAMPLE_DOCUMENTS)).astype(np.int64))


def tokens_per_run(config: ml_collections.ConfigDict, steps: int, long_seq_start_step: int) -> int:
    """Token positions the run's batches hold (padding included): steps x batch x sequence length per phase."""
    data = config.data
    long_len = data.get("long_seq_length", 0)
    long_steps = max(0, steps - long_seq_start_step) if long_len else 0
    return config.batch_size * ((steps - long_steps) * data.max_seq_length + long_steps * long_len)


def report(stats: CorpusStatistics, config: ml_collections.ConfigDict, steps: int, long_seq_start_step: int) -> None:
    """One line of statistics, and a warning when the unknown share is high. steps, long_seq_start_step: the run's
    (its StepPlan's, pretrain/loops/budget.py)."""
    parts = [f"{stats.documents:,} documents"]
    if stats.sentences is not None:
        parts.append(f"{stats.sentences:,} sentences")
    parts.append(f"{stats.tokens:,} tokens")
    if stats.unknown_share is not None:
        parts.append(f"{stats.unknown_share:.2%} unknown")
    epochs = tokens_per_run(config, steps, long_seq_start_step) / max(stats.tokens, 1)
    print(f"Corpus: {', '.join(parts)}; {steps:,} steps of {config.batch_size} sequences cover "
          f"about {epochs:.3g} epochs of it")
    if stats.unknown_share is not None and stats.unknown_share > HIGH_UNKNOWN_SHARE:
        print(f"warning: {stats.unknown_share:.1%} of the corpus's tokens are unknown to the tokenizer "
              f"{config.tokenizer.get('path', '')}: train one on this corpus (python -m pretrain.tools.train_tokenizer)"
              " or check config.tokenizer.lowercase", file=sys.stderr, flush=True)
