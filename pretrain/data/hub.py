"""Corpora from the Hugging Face Hub through `datasets`: a Hub name (`wikimedia/wikipedia`, `HuggingFaceFW/fineweb-edu`)
or a local folder in a Hub repository's layout (parquet, JSON lines or text files, e.g. data/train-*.parquet), read as
documents of lines like the other sources (pretrain/data/sources.py): each example's `text_column` is one document.

`streaming` reads the examples as they arrive (an `IterableDataset`) instead of first converting the whole split to
the Arrow cache on disk: the way to take the first documents of a corpus of terabytes, to prepare one into
ArrayRecord shards (pretrain/tools/prepare_corpus.py), or to pretrain on one as it streams (`StreamedCorpus`).
`shard=(index, count)` gives one reader its part (`split_dataset_by_node`: whole files where the files divide evenly,
every count-th example otherwise).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator

from pretrain.data.sources import CorpusError, Document, to_document


def load(path: str, *, name: str = "", split: str = "train", data_files: str = "", streaming: bool = False):
    """`datasets.load_dataset` of one split, its failures as CorpusError lines that name the fix."""
    try:
        import datasets
    except ImportError:
        raise CorpusError("config.data.source=hf needs the datasets library: pip install 'lmpretrain[datasets]' "
                          "(or pip install datasets)") from None
    files = [f.strip() for f in data_files.split(",") if f.strip()] if data_files else None
    try:
        return datasets.load_dataset(path, name or None, split=split, data_files=files, streaming=streaming)
    except ConnectionError as e:  # offline (HF_DATASETS_OFFLINE=1, or no network) and not in the cache
        raise CorpusError(f"the Hub dataset {path!r} could not be reached and is not in the cache ({_line(e)}): run "
                          "once with the network, or download its files and give that local folder as "
                          "--config.data.hf_path (or the files as --config.data.data_files)") from None
    except FileNotFoundError as e:
        raise CorpusError(f"no dataset at {path!r} ({_line(e)}): give a Hub name (owner/name) or a local folder of "
                          "parquet, JSON lines or text files in --config.data.hf_path") from None
    except ValueError as e:  # an unknown split or config name: datasets' message lists the ones there are
        raise CorpusError(f"the dataset {path!r}: {_line(e)} (set --config.data.hf_split or "
                          "--config.data.hf_name)") from None


def _line(error: Exception) -> str:
    """The first line of a library's message (the errors here are one line)."""
    return (str(error).splitlines() or [type(error).__name__])[0]


def check_column(dataset, column: str, path: str) -> None:
    """A missing text column names the columns that exist."""
    columns = list(dataset.features or {})  # a streamed dataset of unknown features has none to check
    if columns and column not in columns:
        raise CorpusError(f"the dataset {path!r} has no column {column!r}: its columns are {columns} "
                          "(set --config.data.text_column)")


def iter_documents(path: str, *, name: str = "", split: str = "train", data_files: str = "", streaming: bool = False,
                   text_column: str = "text", shard: tuple[int, int] = (0, 1)) -> Iterator[Document]:
    """The split's documents in the dataset's order (this process's part of them with `shard`); examples without
    text are skipped."""
    dataset = load(path, name=name, split=split, data_files=data_files, streaming=streaming)
    check_column(dataset, text_column, path)
    index, count = shard
    if count > 1:
        from datasets.distributed import split_dataset_by_node
        dataset = split_dataset_by_node(dataset, rank=index, world_size=count)
    dataset = dataset.select_columns([text_column])
    return (document for document in (to_document(example[text_column]) for example in dataset) if document)


class StreamedCorpus:
    """A Hub dataset read as a stream in parts (pretrain/data/streamed.py): windows(index, count, size, start) yields
    part `index` of `count` in windows of `size` documents, each tokenized when it is read (lists of int32 arrays, one
    per line; a document without tokens is dropped from its window), from window `start` on and forever: a part
    that ends starts over. The documents before window `start` are read and dropped untokenized (a resumed
    stream's way back to its position)."""

    def __init__(self, path: str, tokenizer, *, name: str = "", split: str = "train", data_files: str = "",
                 text_column: str = "text"):
        self.path, self.name, self.split, self.data_files, self.text_column = path, name, split, data_files, text_column
        self.tokenizer = tokenizer
        dataset = load(path, name=name, split=split, data_files=data_files, streaming=True)
        check_column(dataset, text_column, path)
        self.num_files = dataset.num_shards

    @property
    def identity(self) -> str:
        """What a checkpoint's position records of the corpus (a resume must read the same one)."""
        return f"hf:{self.path}:{self.name}:{self.split}:{self.data_files}:{self.text_column}"

    def windows(self, index: int, count: int, size: int, start: int = 0) -> Iterator[list]:
        from pretrain.data.sources import encode_documents
        documents = self._endless_part(index, count)
        for _ in zip(range(start * size), documents):
            pass
        while True:
            yield encode_documents(list(itertools.islice(documents, size)), self.tokenizer)

    def _endless_part(self, index: int, count: int) -> Iterator[Document]:
        while True:
            read = 0
            for read, document in enumerate(iter_documents(
                    self.path, name=self.name, split=self.split, data_files=self.data_files, streaming=True,
                    text_column=self.text_column, shard=(index, count)), start=1):
                yield document
            if not read:
                raise CorpusError(f"part {index} of {count} of the dataset {self.path!r} holds no documents (it has "
                                  f"fewer documents than streams): set --config.data.streams below {count}")
