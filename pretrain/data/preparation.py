"""Writes a prepared corpus (pretrain/data/prepared.py's layout) from a stream of documents, on every core.

The input streams through: memory holds the chunks in flight, the last --eval_documents documents (which
documents are last is known only at the end) and one shard writer. Shards are contiguous blocks rather than
round robin so that one is open at a time: an ArrayRecord writer holds ~20 MB plus ~50 bytes per record until
it is closed, so N open writers would cost N times that and grow with the corpus. Blocks need the number of
documents first, so the input is read twice (counting is cheap beside tokenizing).

Tokenizing runs in spawned worker processes over chunks of documents, in order, so that the output is the
same bytes whatever --workers is.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import itertools
import json
import multiprocessing
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

from array_record.python import array_record_module

from pretrain.data import prepared, sources, tokenizers
from pretrain.data.prepared import INDEX, encode_record, shard_name
from pretrain.data.sources import CorpusError
from pretrain.runtime import children

_WRITER_OPTIONS = "group_size:1,zstd:3"  # one record per chunk: random reads decode one document
_CHUNK_CHARS = 1 << 20  # text per worker task: amortises pickling, bounds what is in flight
_CHUNK_DOCUMENTS = 4096
_IN_FLIGHT_PER_WORKER = 2  # chunks queued per worker: keeps every core busy, memory bounded
_OUR_FILES = re.compile(r"(index\.json(\.tmp)?|(train|eval)-\d{5}-of-\d{5}\.array_record)")

_worker_tokenizer = None  # set in each pool worker by _start_worker


def _start_worker(parent_pid: int, tokenizer_options: dict) -> None:
    global _worker_tokenizer
    children.exit_with_parent(parent_pid)  # a SIGKILLed builder leaves no worker behind
    _worker_tokenizer = tokenizers.from_config(tokenizer_options)


def _encode_chunk(documents: list[sources.Document], tokenizer=None) -> tuple[list[tuple[bytes, int]], int]:
    """Documents -> ([(record, number of tokens)] of those that have tokens, in order; how many were read)."""
    encoded = sources.encode_documents(documents, _worker_tokenizer if tokenizer is None else tokenizer)
    return [(encode_record(doc), sum(map(len, doc))) for doc in encoded], len(documents)


def _chunks(documents: Iterable[sources.Document]) -> Iterator[list[sources.Document]]:
    chunk, chars = [], 0
    for document in documents:
        chunk.append(document)
        chars += sum(map(len, document))
        if chars >= _CHUNK_CHARS or len(chunk) >= _CHUNK_DOCUMENTS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _encoded(chunks: Iterator[list], tokenizer: tokenizers.Tokenizer, workers: int) -> Iterator[tuple[list, int]]:
    """_encode_chunk over `chunks`, in order, on `workers` processes with a bounded number of chunks in flight.

    (Pool.imap would read the whole input ahead into its task queue; this holds at most
    _IN_FLIGHT_PER_WORKER * workers chunks.) Spawned, not forked: the parent may hold JAX's threads.
    """
    if workers <= 1:
        yield from (_encode_chunk(chunk, tokenizer) for chunk in chunks)
        return
    context = multiprocessing.get_context("spawn")
    children.quiet_resource_tracker()  # a killed build's semaphores are unlinked without a warning
    with context.Pool(workers, _start_worker, (os.getpid(), tokenizer.load_options)) as pool:
        pending = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) >= _IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


class _ShardWriter:
    """One split's shards, filled in order with `per_shard` documents each (the last takes the rest): one file
    open at a time."""

    def __init__(self, directory: str, split: str, num_shards: int, per_shard: int):
        self.directory, self.per_shard = directory, per_shard
        self.files = [shard_name(split, s, num_shards) for s in range(num_shards)]
        self.documents, self.tokens, self.count = [0] * num_shards, [0] * num_shards, 0
        self._writer, self._shard = None, -1

    def _next_shard(self) -> None:
        self.close()
        self._shard += 1
        path = os.path.join(self.directory, self.files[self._shard])
        self._writer = array_record_module.ArrayRecordWriter(path, _WRITER_OPTIONS)

    def write(self, record: bytes, num_tokens: int) -> None:
        if self._writer is None or (self.documents[self._shard] >= self.per_shard
                                    and self._shard < len(self.files) - 1):
            self._next_shard()
        self._writer.write(record)
        self.documents[self._shard] += 1
        self.tokens[self._shard] += num_tokens
        self.count += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def finish(self) -> dict:
        """Closes the split (shards left empty by dropped documents are written empty) -> its index entry."""
        while self._shard < len(self.files) - 1:
            self._next_shard()
        self.close()
        return {"documents": self.count, "tokens": sum(self.tokens),
                "shards": [{"file": f, "documents": d, "tokens": t}
                           for f, d, t in zip(self.files, self.documents, self.tokens)]}


def _clear_output(directory: str) -> None:
    """Creates `directory` or empties it of an earlier preparation, index first (it must never describe
    shards being rewritten); anything else in it is an error, never deleted."""
    os.makedirs(directory, exist_ok=True)
    names = os.listdir(directory)
    foreign = sorted(n for n in names if not _OUR_FILES.fullmatch(n))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise CorpusError(f"output directory {directory} holds files of its own ({foreign[0]}{more}): give a new or"
                          " empty --output")
    for name in sorted(names, key=lambda n: n != INDEX):
        os.remove(os.path.join(directory, name))


def _write_json_atomically(path: str, value: dict) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def prepare(documents: Callable[[], Iterable[sources.Document]], tokenizer: Mapping, output: str, *,
            num_shards: int, eval_documents: int = 0, workers: int = 1, max_documents: int = 0,
            source: Mapping | None = None, command: str = "", progress: bool = True) -> dict:
    """Tokenizes the documents into `output` (see the module docstring); returns the index written.

    documents: a function returning a fresh stream of the input's documents each call (it is read twice: counted,
    then tokenized), e.g. `functools.partial(sources.iter_text_documents, paths)`. tokenizer: config.tokenizer's
    fields (kind, path, lowercase, extra_ids). max_documents: only the first ones (0: all), as
    config.data.max_documents. Memory is bounded whatever the corpus size: the chunks in flight, the last
    `eval_documents` documents (which are last is known only at the end) and one shard writer.
    With workers > 1 the processes are spawned: call this under `if __name__ == "__main__":`.
    """
    from tqdm import tqdm

    if num_shards < 1 or eval_documents < 0 or max_documents < 0:
        raise CorpusError(f"--num_shards={num_shards} must be >= 1, --eval_documents={eval_documents} and"
                          f" --max_documents={max_documents} >= 0")
    tok = tokenizers.from_config(tokenizer)  # a bad tokenizer fails here, before any worker starts
    info = prepared.tokenizer_info(tok)
    limit = max_documents or None
    with tqdm(documents(), unit=" docs", desc="counting documents", disable=not progress) as counting:
        total = sum(1 for _ in itertools.islice(counting, limit))
    _check_counts(total, eval_documents)  # before anything is written, then again on what tokenizing left
    _clear_output(output)
    per_shard = -(-(total - eval_documents) // num_shards)  # ceil
    train, held, read = _ShardWriter(output, "train", num_shards, per_shard), collections.deque(), 0
    try:
        # closing(): an error in this loop stops the pool now, not when the traceback is collected
        with (tqdm(total=total, unit=" docs", desc=f"preparing {output}", disable=not progress) as bar,
              contextlib.closing(_encoded(_chunks(itertools.islice(documents(), limit)), tok,
                                          max(1, workers))) as encoded):
            for records, num_read in encoded:
                for record in records:
                    held.append(record)
                    if len(held) > eval_documents:
                        train.write(*held.popleft())
                bar.update(num_read)
                read += num_read
    finally:
        train.close()
    if read != total:
        raise CorpusError(f"the input changed while it was prepared ({total} documents counted, then {read} read);"
                          " prepare it again")
    _check_counts(train.count + len(held), eval_documents)
    splits = {"train": train.finish()}
    if eval_documents:
        held_out = _ShardWriter(output, "eval", 1, eval_documents)
        try:
            for record in held:
                held_out.write(*record)
        finally:
            held_out.close()
        splits["eval"] = held_out.finish()
    index = {"format": prepared.FORMAT, "version": prepared.VERSION,
             "record": "little-endian int32 [n_sentences, n sentence lengths, token ids]",
             "layout": "contiguous blocks: a split's documents in order, shard after shard",
             "documents": sum(s["documents"] for s in splits.values()),
             "tokens": sum(s["tokens"] for s in splits.values()), "splits": splits,
             "tokenizer": info, "source": dict(source or {}), "eval_documents": eval_documents,
             "max_documents": max_documents, "command": command,
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    _write_json_atomically(os.path.join(output, INDEX), index)  # last: its presence means complete
    return index


def _check_counts(documents: int, eval_documents: int) -> None:
    if not documents:
        raise CorpusError("the corpus has no documents with tokens (it is empty or the tokenizer maps all of it to"
                          " nothing; check --input / --tfds and --tokenizer)")
    if eval_documents and documents - eval_documents < 2:
        raise CorpusError(f"corpus has {documents} documents, too few to hold out --eval_documents={eval_documents};"
                          " lower it or add text")
