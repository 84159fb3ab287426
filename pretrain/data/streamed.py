"""Pretraining batches from a corpus read as a stream: a Hugging Face Hub dataset with data.streaming=True and no
data.max_documents (pretrain/data/hub.py's StreamedCorpus), never held whole in memory or on disk.

The streams of pretrain/data/streaming.py, each reading its own part of the dataset: stream k of S reads part k
(`split_dataset_by_node(rank=k, world_size=S)`: whole files where S divides the file count, every S-th example
otherwise), in the dataset's order, `window_documents` documents a window, tokenized as they arrive; the rows of
its j-th window are streaming.py's (objective.create_instances + make_batch) with the randomness of window k + j S.
A process builds only its own streams, so it reads only their parts, and the batch of a step is still a function of
(seed, step, S): a run resumes on any number of processes that divides S. A stream's position is streaming.py's
[window, row]: a resumed stream reads its part again up to that window (reading, not tokenizing, the documents
before it) and goes on bitwise. A streamed part has no random access, so there is no shuffle: a part that ends is
read again in the same order. With data.streams=0, S follows the file count (a power of two dividing the batch,
from 8 to 64, at most the files where there are 8 or more), so that the parts are whole files.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from objectives.interface import Objective
from pretrain.data.hub import StreamedCorpus
from pretrain.data.streaming import Arrays, Phase, StreamingData, Stream, window_rows
from pretrain.runtime.errors import ConfigError


class StreamedData(StreamingData):
    """StreamingData over a StreamedCorpus: the same streams, positions and batches, each stream's windows read
    from its part of the stream."""

    def __init__(self, corpus: StreamedCorpus, objective: Objective, *, workers: int = 0, **kwargs: Any):
        if workers:
            raise ConfigError(f"config.data.workers={workers}: a streamed corpus builds its windows in the loop's "
                              "thread (its parts are read in order); set 0, or prepare the corpus (prepare_corpus "
                              "--hf) for worker processes")
        self.num_files = corpus.num_files
        super().__init__(corpus, objective, workers=0, **kwargs)

    def _fit_windows(self, window_documents: int) -> tuple[int, int]:
        return window_documents, self.num_files  # auto streams: as many as the files, so that a part is whole files

    def _corpus_key(self) -> str:
        return self.documents.identity

    def _open(self, phase: int, windows: list[list[int]]) -> None:
        self.close()
        for k in self.local_streams:
            window, row = windows[k]
            read = self.documents.windows(k, self.streams, self.window_documents, start=window)
            rows = _PartWindows(read, k, self.streams, window, self.phases[phase], self.seed, phase)
            self._streams[k] = Stream(rows, window, row)
        self._phase = phase


class _PartWindows:
    """Stream k's windows from its part, in order: the rows of its j-th window (window_rows, with the randomness of
    window k + j S, as streaming.py numbers a stream's windows), j = start, start + 1, ..."""

    def __init__(self, read: Iterator[list], stream: int, streams: int, start: int, phase: Phase, seed: int,
                 phase_index: int):
        self.read, self.stream, self.streams, self.j = read, stream, streams, start
        self.phase, self.seed, self.phase_index = phase, seed, phase_index

    def __call__(self) -> Arrays:
        documents = next(self.read)
        rows = window_rows(documents, self.phase.objective, self.phase.seq_length, self.seed, self.phase_index,
                           self.stream + self.streams * self.j)
        self.j += 1
        return rows
