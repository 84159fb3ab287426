"""Tokenized corpora on disk: documents tokenized once by pretrain.tools.prepare_corpus into ArrayRecord shards, then
read by random access (a grain data source) instead of reading and tokenizing the text at every start.

A prepared directory holds
  train-00000-of-0000N.array_record ...  the training documents in contiguous blocks of ceil(documents / N)
  eval-00000-of-00001.array_record       the LAST --eval_documents documents (config.data.eval_documents' hold-out)
  index.json                             counts per split and shard, the tokenizer and its fingerprint, the command
index.json is written last and atomically: a directory without it (a killed preparation, a partial copy) is no corpus.
pretrain/data/preparation.py writes it.

A record is one document, little-endian int32: [n] + [len_0 .. len_n-1] + [ids of sentence 0] + [ids of 1] ...,
1 + n + sum(len) values. Sentences stay apart for NSP, whole-word masking and SpanBERT, which work on them.
ArrayRecord stores each record as its own zstd chunk (group_size 1), so a read decodes one document.

The order is the input's, after dropping documents without tokens (as sources.tokenize_documents does):
`corpus[i]` is document i, whatever --workers and --num_shards were. (A dropped document shortens the last shard.)
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from array_record.python import array_record_module
from array_record.python.array_record_data_source import ArrayRecordDataSource

from pretrain.data import tokenizers
from pretrain.data.sources import CorpusError

FORMAT, VERSION = "lmpretrain-prepared-corpus", 1
INDEX = "index.json"
_READ_BATCH = 1024  # records per batched read when iterating


def shard_name(split: str, shard: int, num_shards: int) -> str:
    return f"{split}-{shard:05d}-of-{num_shards:05d}.array_record"


def encode_record(sentences: Sequence[np.ndarray]) -> bytes:
    """A document (one int32 array per sentence) -> [n, len_0 .. len_n-1, ids...] as little-endian int32 bytes."""
    header = np.array([len(sentences), *map(len, sentences)], "<i4")
    return np.concatenate([header, *sentences]).astype("<i4", copy=False).tobytes()


def decode_record(record: bytes) -> list[np.ndarray]:
    """encode_record's inverse: -> one int32 array per sentence (views of one writable copy)."""
    values = np.frombuffer(record, "<i4").astype(np.int32)  # [1 + n + tokens]
    n = int(values[0])
    ends = (np.cumsum(values[1:1 + n]) + 1 + n).tolist()  # slicing: np.split costs 4x as much per sentence
    return [values[start:end] for start, end in zip([1 + n, *ends[:-1]], ends)]


def tokenizer_info(tokenizer: tokenizers.Tokenizer) -> dict:
    """What index.json records of the tokenizer (from load_tokenizer / from_config)."""
    options = tokenizer.load_options
    return {"kind": options["kind"], "path": os.path.abspath(options["path"]), "lowercase": options["lowercase"],
            "extra_ids": options["extra_ids"], "vocab_size": tokenizer.vocab_size,
            "fingerprint": tokenizers.fingerprint(tokenizer)}


def _describe(info: Mapping) -> str:
    case = {True: "lowercase, ", False: "cased, ", None: ""}[info["lowercase"]]
    return f"{info['kind']} {info['path']} ({case}extra_ids={info['extra_ids']}, sha256 {info['fingerprint'][:12]})"


# ----------------------------------------------------------------------------------------------
# Reading.


def read_index(directory: str) -> dict:
    """directory/index.json, checked to be a complete preparation this code reads."""
    if os.path.isfile(directory):
        raise CorpusError(_a_file(directory))
    if not os.path.isdir(directory):
        raise CorpusError(f"prepared corpus directory {directory} not found (write one with python -m"
                          f" pretrain.tools.prepare_corpus --output={directory}, or fix --config.data.path)")
    path = os.path.join(directory, INDEX)
    if not os.path.isfile(path):
        raise CorpusError(f"{directory} has no {INDEX}, so it is no prepared corpus (or its preparation did not"
                          f" finish): run python -m pretrain.tools.prepare_corpus --output={directory}")
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise CorpusError(f"{path} is not a version-{VERSION} {FORMAT} index (found {index.get('format')} version"
                          f" {index.get('version')}): prepare the corpus again with python -m"
                          " pretrain.tools.prepare_corpus")
    return index


def _a_file(path: str) -> str:
    """What is wrong with a file given as a prepared corpus, and fixes that keep it."""
    if os.path.basename(path) == INDEX or path.endswith(".array_record"):
        return (f"{path} is a file of a prepared corpus, not its directory: give the directory, "
                f"--config.data.path={os.path.dirname(path) or '.'}")
    output = os.path.splitext(path)[0] + "_prepared"
    return (f"{path} is a file, not a prepared corpus directory: read a text corpus as it stands with "
            f"--config.data.source=text, or prepare it into a new directory with python -m"
            f" pretrain.tools.prepare_corpus --input={path} --output={output} and give that directory")


def _num_records(path: str) -> int:
    """The shard's record count; a damaged file (truncated copy) is a one-line error."""
    problem = None
    try:
        reader = array_record_module.ArrayRecordReader(path)
        count = reader.num_records() if reader.ok() else None
        reader.close()  # a reader that is not ok raises its error here
    except Exception as e:  # the C++ reader's error, e.g. "chunk header hash mismatch ..."
        problem = str(e).splitlines()[0] if str(e) else type(e).__name__
    if problem or count is None:
        raise CorpusError(f"cannot read shard {path}: {problem or 'not an ArrayRecord file'} (copy the prepared"
                          " directory again or re-run python -m pretrain.tools.prepare_corpus)")
    return count


class PreparedCorpus(Sequence):
    """One split of a prepared directory: `corpus[i]` -> document i, a list of int32 arrays (one per sentence).

    Picklable and cheap to unpickle (files open lazily, on the first read in each process), so it serves
    as a grain data source as it stands: `grain.MapDataset.source(corpus)`.
    """

    def __init__(self, directory: str, split: str, index: dict):
        self.directory, self.split, self.index = directory, split, index
        shards = index["splits"][split]["shards"]
        counts = [shard["documents"] for shard in shards]
        self._length = sum(counts)  # the shards are consecutive blocks: document i is record i of their concatenation
        # "file[0:n]": the data source takes the counts from here instead of opening every file up front.
        self._paths = [f"{os.path.join(directory, shard['file'])}[0:{n}]" for shard, n in zip(shards, counts)]
        self._source = None
        self._first, self._tokens = 0, index["splits"][split]["tokens"]  # hold_out's parts: a range of the split

    @classmethod
    def open(cls, directory: str, split: str = "train",
             tokenizer: tokenizers.Tokenizer | Mapping | None = None) -> PreparedCorpus:
        """Checks index.json, every shard's presence and record count, and (if given) that `tokenizer` (a loaded
        tokenizer or config.tokenizer) is the one the corpus was prepared with."""
        directory = os.path.expanduser(directory)
        index = read_index(directory)
        if split not in index["splits"]:
            raise CorpusError(f"prepared corpus {directory} has no {split!r} split (it has {sorted(index['splits'])};"
                              " python -m pretrain.tools.prepare_corpus --eval_documents=K holds out an eval split)")
        for shard in index["splits"][split]["shards"]:
            path = os.path.join(directory, shard["file"])
            if not os.path.isfile(path):
                raise CorpusError(f"prepared corpus {directory} lacks its shard {shard['file']} (listed in {INDEX}):"
                                  " copy the whole directory again or re-run python -m pretrain.tools.prepare_corpus")
            found = _num_records(path)
            if found != shard["documents"]:
                raise CorpusError(f"shard {path} holds {found} documents but {INDEX} says {shard['documents']}: copy"
                                  " the whole directory again or re-run python -m pretrain.tools.prepare_corpus")
        if tokenizer is not None:
            check_tokenizer(directory, index, tokenizer)
        return cls(directory, split, index)

    def hold_out(self, count: int) -> tuple[PreparedCorpus, PreparedCorpus]:
        """(all but the last `count` documents, the last `count`), as config.data.eval_documents holds out the end of
        a text corpus: a split's documents read by random access, never copied."""
        if len(self) - count < 2:
            raise CorpusError(f"prepared corpus {self.directory} has {len(self)} {self.split} documents, too few to"
                              f" hold out config.data.eval_documents={count}; lower it or prepare more text")
        held = copy.copy(self)
        held._first, held._length = self._first + len(self) - count, count
        held._tokens = sum(len(sentence) for document in held for sentence in document)
        kept = copy.copy(self)
        kept._length, kept._tokens = len(self) - count, self._tokens - held._tokens
        return kept, held

    @property
    def num_tokens(self) -> int:
        return self._tokens

    @property
    def num_shards(self) -> int:
        return len(self._paths)

    def __len__(self) -> int:
        return self._length

    def _records(self) -> ArrayRecordDataSource:
        if self._source is None:
            self._source = ArrayRecordDataSource(self._paths)
        return self._source

    def _key(self, i) -> int:
        i = int(i)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError(f"document {i} of a {self._length}-document corpus")
        return self._first + i

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.__getitems__(range(*i.indices(self._length)))
        return decode_record(self._records()[self._key(i)])

    def __getitems__(self, indices: Sequence[int]) -> list[list[np.ndarray]]:
        """Batched random read (grain calls it): one read per shard, in parallel threads."""
        keys = [self._key(i) for i in indices]
        return [decode_record(r) for r in self._records().__getitems__(keys)] if keys else []

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        for start in range(0, self._length, _READ_BATCH):
            yield from self.__getitems__(range(start, min(start + _READ_BATCH, self._length)))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_source": None}  # readers do not cross processes; reopened lazily

    def __repr__(self) -> str:
        return (f"PreparedCorpus({self.directory!r}, split={self.split!r}, documents={self._length},"
                f" tokens={self.num_tokens}, shards={self.num_shards})")


def check_tokenizer(directory: str, index: Mapping, tokenizer: tokenizers.Tokenizer | Mapping) -> None:
    """A one-line error unless `tokenizer` has the fingerprint of the one that prepared the corpus."""
    if not isinstance(tokenizer, tokenizers.Tokenizer):
        tokenizer = tokenizers.from_config(tokenizer)
    prepared, current = index["tokenizer"], tokenizer_info(tokenizer)
    if current["fingerprint"] == prepared["fingerprint"] or _same_but_for_case(tokenizer, prepared):
        return
    again = (f"python -m pretrain.tools.prepare_corpus --tokenizer={current['path']}"
             f" --tokenizer_kind={current['kind']}"
             + " --no-lowercase" * (current["lowercase"] is False) + f" --extra_ids={current['extra_ids']}" *
             bool(current["extra_ids"]))
    differ = [f"--config.tokenizer.{k}={prepared[k]}" for k in ("kind", "path", "lowercase", "extra_ids")
              if prepared[k] != current[k] and prepared[k] is not None]
    back = f"set {' '.join(differ)}" if differ else f"restore the file {prepared['path']} had then"
    raise CorpusError(f"prepared corpus {directory} was tokenized with {_describe(prepared)}, but the config loads"
                      f" {_describe(current)}: prepare it again with this tokenizer ({again}) or {back}")


def _same_but_for_case(tokenizer: tokenizers.Tokenizer, prepared: Mapping) -> bool:
    """The preparation's tokenizer but for `lowercase`, which changes no id of a model that folds case by itself
    (train_tokenizer's default): a corpus prepared lowercase feeds a cased config of the same model, and back."""
    return (tokenizer.folds_case and prepared["lowercase"] is not None
            and tokenizers.fingerprint(tokenizer, lowercase=prepared["lowercase"]) == prepared["fingerprint"])
