"""Streaming pretraining batches on Grain: documents by random access, instances built on the fly.

The corpus is any random-access sequence of tokenized documents: a `prepared.PreparedCorpus` (ArrayRecord
shards, never loaded whole) or the in-memory list of a small text/TFDS corpus. Per phase (sequence length):

  documents --shuffle (per epoch, O(1) memory)--> endless document order
            --batch(window_documents)--> windows; window w belongs to stream w % S
  window w  --objective.create_instances + make_batch, rng (seed, phase, w)--> rows   (Grain workers)
  stream k  --rows in order, B / S per step--> its part of the global batch

So NSP pairs, dynamic masking, span corruption and packing run the same objective code as before, on
`window_documents` random documents at a time, in `workers` processes per host (Grain's mp_prefetch keeps
the order whatever the worker count). The global batch of step s is streams 0..S-1 in order; process p of
P builds only streams [p S / P, (p + 1) S / P), i.e. its contiguous rows of the global batch, all of them
from one Grain iterator over their windows (_LocalWindows). A batch is therefore a pure function of
(seed, step, S): it does not depend on the number of processes or workers.

S is `data.streams`, or with the default 0 (auto) gcd(batch_size, 2^k) with 2^k in [8, 64] (more for a
corpus of more windows per epoch; see `auto_streams`): not the process count, so a run preempted on 4 hosts
resumes on 8, 2 or 1 with the same batches (elastic resume). A resume with auto takes the checkpoint's S (an
older checkpoint, written with one stream per process, keeps its order) if the processes can share it; an
explicit `data.streams` must equal the checkpoint's. The price of S streams: each holds about one window in
memory, and the first step waits for S windows to be built.

Rows per window vary, so a stream's position is (window, row) rather than arithmetic in the step: `position()`
goes into every checkpoint (all streams, gathered from every process) and `iterate` resumes from it.
"""
from __future__ import annotations

import collections
import functools
import math
import os
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import grain
import numpy as np

from objectives.interface import Objective, PhasedObjective
from pretrain.runtime import children
from pretrain.runtime.errors import ConfigError

Arrays = dict[str, np.ndarray]
POSITION_FORMAT = 2  # position dicts of the in-memory PretrainingData before streaming (format 1) had no streams
# Windows built ahead of the consumer, per process (in each worker when workers > 0). Grain's default (16 threads,
# 500 elements) would hold hundreds of windows in memory: a window of a one-document corpus is the whole
# corpus, and one window already feeds many steps.
READ_AHEAD = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)

# data.streams=0 (auto): S = gcd(batch_size, 2^k), whatever the number of processes. TPU host counts are powers of
# two, so any slice whose host count divides S shares the same streams. Each stream holds about one window
# in memory and builds one before step 1, so 2^k grows with the corpus: the power of two of its windows per
# epoch, at least 8 and at most 64. A small corpus (a one-document raw text: each window is the whole corpus)
# then holds at most 8 copies; a large one 64 windows of `window_documents` documents (docs/training.md).
AUTO_STREAMS = (8, 64)


def auto_streams(batch_size: int, windows_per_epoch: int) -> tuple[int, int]:
    """(streams, 2^k) of data.streams=0 for a global batch of `batch_size` rows."""
    power = 1 << (max(1, windows_per_epoch).bit_length() - 1)
    cap = min(max(power, AUTO_STREAMS[0]), AUTO_STREAMS[1])
    return math.gcd(batch_size, cap), cap


class Phase(NamedTuple):
    start_step: int
    seq_length: int
    objective: Objective


class _WindowRows:
    """window index, [W] document indices -> that window's rows (instances made into a batch), [n, ...] each."""

    def __init__(self, documents: Sequence, objective: Objective, seq_length: int, seed: int, phase: int):
        self.documents, self.objective, self.seq_length, self.seed, self.phase = (
            documents, objective, seq_length, seed, phase)

    def __call__(self, window: int, indices: list[int]) -> Arrays:
        return window_rows(_read(self.documents, indices), self.objective, self.seq_length, self.seed, self.phase,
                           window)


def window_rows(documents: list, objective: Objective, seq_length: int, seed: int, phase: int, window: int) -> Arrays:
    """A window's documents -> its rows: the objective's instances made into a batch, [n, ...] each, with the
    randomness of (seed, phase, window) alone."""
    rng = np.random.default_rng([seed, phase, window])
    return objective.make_batch(objective.create_instances(documents, rng, seq_length), rng)


def _read(documents: Sequence, indices: list[int]) -> list:
    """The documents at `indices`, in one batched read where the source has one (a PreparedCorpus reads each
    shard once, in parallel threads, rather than record by record)."""
    read_many = getattr(documents, "__getitems__", None)
    return read_many(indices) if read_many else [documents[i] for i in indices]


class Stream:
    """One stream's rows, `rows` at a time, from window `window` row `row` on (its resumable position)."""

    def __init__(self, next_window: Callable[[], Arrays], window: int, row: int):
        self.window, self.row = window, row
        self._next_window = next_window
        self._current: Arrays | None = None

    def take(self, rows: int) -> Arrays:
        parts = []
        while rows:
            if self._current is None:
                self._current = self._next_window()
                self._size = len(next(iter(self._current.values())))
            n = min(rows, self._size - self.row)
            parts.append({k: v[self.row:self.row + n] for k, v in self._current.items()})
            rows -= n
            self.row += n
            if self.row == self._size:  # window used up (a window may have no rows at all)
                self._current, self.window, self.row = None, self.window + 1, 0
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class _LocalOrder:
    """Index i of this process's windows -> (its stream, the stream's window j): round-robin over the local
    streams, so for one process the global window order itself. Picklable for Grain's worker processes."""

    def __init__(self, streams: int, local: range, starts: list[int]):
        self.streams, self.first, self.count, self.starts = streams, local.start, len(local), starts

    def stream_window(self, i: int) -> tuple[int, int]:
        return self.first + i % self.count, i // self.count

    def keep(self, i: int) -> bool:
        """Windows a resumed stream has used already are skipped before they are built."""
        return i // self.count >= self.starts[i % self.count]


class _ReadWindow:
    """Index i of this process's windows -> (stream, the rows of its window): built in Grain's workers."""

    def __init__(self, windows: grain.MapDataset, order: _LocalOrder):
        self.windows, self.order = windows, order

    def __call__(self, i: int) -> tuple[int, Arrays]:
        k, j = self.order.stream_window(i)
        return k, self.windows[k + self.order.streams * j]  # stream k's windows: k, k + S, k + 2 S, ...


class _LocalWindows:
    """The windows of all of this process's streams from one Grain iterator (one thread, or `workers` worker
    processes, whatever the number of streams), in window order; a window that comes before its stream asks
    for it waits in memory. Streams use rows at the same rate, so few wait: about one window per stream is
    in memory, plus READ_AHEAD's (per worker)."""

    def __init__(self, windows: grain.MapDataset, streams: int, local: range, starts: list[int], workers: int):
        order = _LocalOrder(streams, local, starts)
        stop = len(windows) // streams * len(local)
        dataset = grain.MapDataset.range(min(starts) * len(local), stop).filter(order.keep)
        dataset = dataset.map(_ReadWindow(windows, order)).to_iter_dataset(READ_AHEAD)
        if workers > 0:
            # the workers end with this process, even when it is SIGKILLed, and what they leave is unlinked
            # quietly (pretrain/runtime/children.py)
            children.quiet_resource_tracker()
            dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers),
                                          worker_init_fn=functools.partial(children.exit_with_parent, os.getpid()))
        self._iterator = iter(dataset)
        self._waiting: dict[int, collections.deque] = {k: collections.deque() for k in local}

    def next_window(self, stream: int) -> Arrays:
        while not self._waiting[stream]:
            owner, rows = next(self._iterator)
            self._waiting[owner].append(rows)
        return self._waiting[stream].popleft()

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


class StreamingData:
    """This process's rows of the global batch of each step, from `iterate(start_step, position)`. A subclass that
    reads its corpus another way (pretrain/data/streamed.py) overrides _fit_windows, _corpus_key and _open: the
    streams, their positions and the batches of a step stay this class's."""

    def __init__(self, documents: Sequence, objective: Objective, *, batch_size: int, seed: int,
                 max_seq_length: int, long_seq_length: int = 0, long_seq_start_step: int = 0,
                 window_documents: int = 256, streams: int = 0, workers: int = 0,
                 process_index: int = 0, process_count: int = 1):
        if window_documents < 1:
            raise ConfigError(f"config.data.window_documents={window_documents} must be at least 1")
        self.documents = documents
        self.batch_size, self.seed, self.workers = batch_size, seed, workers
        self.process_index, self.process_count = process_index, process_count
        self.window_documents, windows_per_epoch = self._fit_windows(window_documents)
        self.auto = not streams  # the stream count may still become a checkpoint's (adopt_streams)
        auto, cap = auto_streams(batch_size, windows_per_epoch)
        self._use_streams(streams or auto, "" if streams else
                          f"auto: the largest power-of-two divisor of config.batch_size={batch_size} up to {cap}")
        self.phases = [Phase(0, max_seq_length, objective)]
        if long_seq_length:
            long_objective = objective.for_long_phase() if isinstance(objective, PhasedObjective) else objective
            self.phases.append(Phase(long_seq_start_step, long_seq_length, long_objective))
        self._streams: dict[int, Stream] = {}
        self._windows_of: _LocalWindows | None = None
        self._phase = -1

    def _fit_windows(self, window_documents: int) -> tuple[int, int]:
        """(documents per window, windows per epoch). A corpus smaller than a window is one window per epoch: each
        window is a whole shuffled epoch."""
        if not len(self.documents):
            raise ConfigError("the corpus has no documents (check --config.data.path)")
        size = min(window_documents, len(self.documents))
        return size, len(self.documents) // size

    def _use_streams(self, streams: int, auto: str, fix: str = "") -> None:
        """S streams and this process's share of them. `auto`: why S, where data.streams=0 chose it; `fix`: what
        to do where the processes cannot share that S (for the one-line errors)."""
        if self.batch_size % self.process_count:
            raise ConfigError(f"config.batch_size={self.batch_size} is not divisible by the number of processes "
                              f"({self.process_count}): choose a batch size divisible by it")
        if streams % self.process_count and not auto:
            raise ConfigError(f"config.data.streams={streams} must be a multiple of the number of processes "
                              f"({self.process_count}); use 0 for a stream count fixed by the batch size")
        if streams % self.process_count:
            fix = fix or (f"set --config.data.streams to a multiple of {self.process_count} that divides "
                          f"config.batch_size={self.batch_size}")
            raise ConfigError(f"config.data.streams=0 means {streams} streams ({auto}), which {self.process_count}"
                              f" processes cannot share: {fix}")
        if self.batch_size % streams:
            raise ConfigError(f"config.batch_size={self.batch_size} is not divisible by config.data.streams="
                              f"{streams}: choose a batch size divisible by it")
        self.streams = streams
        per_process = streams // self.process_count
        self.local_streams = range(self.process_index * per_process, (self.process_index + 1) * per_process)
        self.rows_per_stream = self.batch_size // streams

    def adopt_streams(self, streams: int) -> None:
        """data.streams=0 takes the stream count of the checkpoint it resumes, so that its data order goes on
        (older checkpoints, with one stream per process, included); an explicit data.streams stays, and
        check_position compares it with the checkpoint's."""
        if self.auto and streams != self.streams and self.batch_size % streams == 0:
            self._use_streams(streams, "auto: those of the checkpoint it resumes",
                              f"resume on a number of processes that divides {streams}, or use a new --workdir")

    def resume_from(self, position: dict[str, Any]) -> None:
        """A checkpoint's position: adopt its stream count (data.streams=0), then check it fits this config."""
        if isinstance(position.get("streams"), int) and position.get("batch_size") == self.batch_size:
            self.adopt_streams(position["streams"])
        self.check_position(position)

    # ----- Positions -----
    def phase(self, step: int) -> int:
        return max(i for i, p in enumerate(self.phases) if step >= p.start_step)

    def _order(self) -> dict[str, Any]:
        """What fixes the data order besides the step: a resume must agree on all of it."""
        return {"format": POSITION_FORMAT, "seed": self.seed, "streams": self.streams,
                "window_documents": self.window_documents, "batch_size": self.batch_size,
                "documents": self._corpus_key()}

    def _corpus_key(self) -> int | str:
        """The position's record of the corpus: its document count."""
        return len(self.documents)

    def start_position(self, step: int) -> dict[str, Any]:
        """The position of a fresh run at a phase's first step (every stream at window 0, row 0)."""
        return {**self._order(), "step": step, "phase": self.phase(step),
                "windows": [[0, 0] for _ in range(self.streams)]}

    def local_position(self) -> list[list[int]]:
        """[[window, row]] of this process's streams, in stream order."""
        return [[self._streams[k].window, self._streams[k].row] for k in self.local_streams]

    def check_position(self, position: dict[str, Any]) -> None:
        """A checkpoint's position -> ConfigError naming the keys that differ from this config."""
        differ = {k: (position.get(k), v) for k, v in self._order().items() if position.get(k) != v}
        if differ:
            listed = ", ".join(f"{k}: {old} in the checkpoint, {new} now" for k, (old, new) in differ.items())
            raise ConfigError(f"the checkpoint was written with another data order ({listed}); "
                              "resume with the config that wrote it or use a new --workdir")

    # ----- Batches -----
    def document_order(self, phase: int) -> grain.MapDataset:
        """The endless order of document indices of a phase: every epoch a new permutation (Grain's index
        shuffle, O(1) memory whatever the corpus size)."""
        # Not .repeat() without a count: its length, sys.maxsize, overflows slicing once windows of one document
        # make the window count that large too. 2^40 documents in all is endless enough.
        epochs = max(1, 2 ** 40 // len(self.documents))
        return grain.MapDataset.range(len(self.documents)).shuffle(seed=_mix(self.seed, phase)).repeat(epochs)

    def _windows(self, phase: int) -> grain.MapDataset:
        """Element w = the rows of window w (`window_documents` consecutive documents of the order), its
        documents read together when the window is built."""
        p = self.phases[phase]
        windows = self.document_order(phase).batch(self.window_documents, batch_fn=list)
        return windows.map_with_index(_WindowRows(self.documents, p.objective, p.seq_length, self.seed, phase))

    def _open(self, phase: int, windows: list[list[int]]) -> None:
        self.close()
        self._windows_of = _LocalWindows(self._windows(phase), self.streams, self.local_streams,
                                         [windows[k][0] for k in self.local_streams], self.workers)
        for k in self.local_streams:
            window, row = windows[k]
            self._streams[k] = Stream(functools.partial(self._windows_of.next_window, k), window, row)
        self._phase = phase

    def iterate(self, start_step: int, position: dict[str, Any] | None = None
                ) -> Iterator[tuple[int, Arrays, list[list[int]]]]:
        """(step, this process's rows of the step's batch, its streams' [window, row] after them), forever.

        The position travels with the batch so that a loop that builds batches ahead on a thread still
        stores, with checkpoint s, where step s's successor starts.
        """
        position = position or self.start_position(start_step)
        self.resume_from(position)
        self._open(position["phase"], position["windows"])
        step = start_step
        while True:
            phase = self.phase(step)
            if phase != self._phase:
                self._open(phase, self.start_position(step)["windows"])
            parts = [self._streams[k].take(self.rows_per_stream) for k in self.local_streams]
            yield step, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, self.local_position()
            step += 1

    def position(self, step: int, windows: list[list[int]]) -> dict[str, Any]:
        """The checkpoint record for step `step`: every stream's [window, row] after the batches before it
        (`windows`: gathered from all processes, in stream order) and the phase they belong to."""
        if len(windows) != self.streams:
            raise ValueError(f"position of {len(windows)} streams, expected {self.streams}")
        return {**self._order(), "step": step, "phase": self.phase(step - 1) if step else 0,
                "windows": [list(map(int, w)) for w in windows]}

    def close(self) -> None:
        if self._windows_of is not None:
            self._windows_of.close()
        self._windows_of, self._streams = None, {}


def _mix(*values: int) -> int:
    """Seeds -> one 32-bit shuffle seed (Grain's shuffle takes an int)."""
    return int(np.random.default_rng(list(values)).integers(2**31 - 1))
