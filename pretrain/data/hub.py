"""Corpora from the Hugging Face Hub through `datasets`: a Hub name (`wikimedia/wikipedia`, `HuggingFaceFW/fineweb-edu`)
or a local folder in a Hub repository's layout (parquet, JSON lines or text files, e.g. data/train-*.parquet), read as
documents of lines like the other sources (pretrain/data/sources.py): each example's `text_column` is one document.
A local folder's splits are its files named by them (local_layout), its configs a README.md's `configs:` or, without
one, a folder each. Each error names the fix in the options of the command that reads (`Flags`).

`streaming` reads the examples as they arrive (an `IterableDataset`) instead of first converting the whole split to
the Arrow cache on disk: the way to take the first documents of a corpus of terabytes, to prepare one into
ArrayRecord shards (pretrain/tools/prepare_corpus.py), or to pretrain on one as it streams (`StreamedCorpus`).
`shard=(index, count)` gives one reader its part (`split_dataset_by_node`: whole files where the files divide evenly,
every count-th example otherwise).
"""
from __future__ import annotations

import dataclasses
import glob
import itertools
import os
from collections.abc import Iterator

from pretrain.data.sources import CorpusError, Document, to_document


@dataclasses.dataclass(frozen=True)
class Flags:
    """How the command that reads a Hub dataset names its options, for the fixes its errors name (None: it has no such
    option, e.g. a task, whose config and split are its own)."""
    path: str = "--config.data.hf_path"
    name: str | None = "--config.data.hf_name"
    split: str | None = "--config.data.hf_split"
    data_files: str | None = "--config.data.data_files"
    text_column: str | None = "--config.data.text_column"
    first_documents: str | None = "--config.data.max_documents=N"
    not_streaming: str | None = "set --config.data.streaming=False"

    @classmethod
    def of_task(cls, path: str = "--config.data.hf_path") -> Flags:
        """A fine-tuning task's: only the dataset is the person's to choose."""
        return cls(path, None, None, None, None, None, None)


CONFIG_FLAGS = Flags()  # a pretraining config's config.data


def check_split(split: str, streaming: bool, flags: Flags = CONFIG_FLAGS) -> None:
    """A streamed split is read whole: a slice (train[:10%]) is refused before anything is opened, naming the fix."""
    if streaming and "[" in split:
        whole = split.split("[", 1)[0]
        fixes = [f"set {flags.split}={whole} and {flags.first_documents} for its first N documents" if flags.split
                 else "", f"{flags.not_streaming} to read {split} into memory" if flags.not_streaming else ""]
        raise CorpusError(f"split {split!r} with streaming: a stream cannot slice a split (datasets streams whole "
                          f"splits): {', or '.join(filter(None, fixes)) or 'read it without streaming'}")


def card_names_configs(folder: str) -> bool:
    """Whether a local folder's README.md maps its files to configs (front matter with `configs:`), as a Hub
    repository's card does."""
    try:
        with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
            text = f.read(1 << 16)
    except OSError:
        return False
    front = text.split("\n---", 1)[0] if text.startswith("---") else ""
    return any(line.startswith("configs:") for line in front.splitlines())


def local_layout(path: str, name: str, split: str) -> tuple[str, str, dict | None]:
    """(path, name, data files) to load. A local folder whose card names no configs holds config `name` as its folder
    of that name, and a split as the files named by it (<split>-00000-of-00001.parquet, <split>.jsonl, also under
    data/), whatever the split's name (datasets itself knows only train, validation and test by their files)."""
    if not os.path.isdir(path) or card_names_configs(path):
        return path, name, None
    if name and os.path.isdir(os.path.join(path, name)):
        path, name = os.path.join(path, name), ""
    whole = split.split("[", 1)[0]
    files = sorted(found for folder in (path, os.path.join(path, "data")) for pattern in (f"{whole}-*", f"{whole}.*")
                   for found in glob.glob(os.path.join(glob.escape(folder), pattern)) if os.path.isfile(found))
    return path, name, {whole: files} if files else None


def load(path: str, *, name: str = "", split: str = "train", data_files: str = "", streaming: bool = False,
         flags: Flags = CONFIG_FLAGS):
    """`datasets.load_dataset` of one split, its failures as CorpusError lines that name the fix (in `flags`)."""
    check_split(split, streaming, flags)
    try:
        import datasets
    except ImportError:
        raise CorpusError("the Hugging Face Hub source needs the datasets library: pip install 'lmpretrain[datasets]' "
                          "(or pip install datasets)") from None
    files = [f.strip() for f in data_files.split(",") if f.strip()] if data_files else None
    if files is None:
        path, name, files = local_layout(path, name, split)
    try:
        return datasets.load_dataset(path, name or None, split=split, data_files=files, streaming=streaming)
    except ConnectionError as e:  # offline (HF_DATASETS_OFFLINE=1, or no network) and not in the cache
        raise CorpusError(f"the Hub dataset {path!r} could not be reached and is not in the cache ({_line(e)}): run "
                          f"once with the network, or download its files and give that local folder as {flags.path}"
                          + (f" (or the files as {flags.data_files})" if flags.data_files else "")) from None
    except FileNotFoundError as e:
        raise CorpusError(f"no dataset at {path!r} ({_line(e)}): give a Hub name (owner/name) or a local folder of "
                          f"parquet, JSON lines or text files in {flags.path}") from None
    except ValueError as e:  # an unknown split or config name: datasets' message lists the ones there are
        raise CorpusError(f"the dataset {path!r}: {_line(e)} ({_choose(flags)})") from None


def _choose(flags: Flags) -> str:
    if flags.split or flags.name:
        return "set " + " or ".join(filter(None, (flags.split, flags.name)))
    return (f"its config and split are the task's: give {flags.path} a copy of the task's Hub dataset, its README.md's "
            "configs naming them, or a folder per config of files named by split")


def _line(error: Exception) -> str:
    """The first line of a library's message (the errors here are one line)."""
    return (str(error).splitlines() or [type(error).__name__])[0]


def check_column(dataset, column: str, path: str, flags: Flags = CONFIG_FLAGS) -> None:
    """A missing text column names the columns that exist."""
    columns = list(dataset.features or {})  # a streamed dataset of unknown features has none to check
    if columns and column not in columns:
        raise CorpusError(f"the dataset {path!r} has no column {column!r}: its columns are {columns} "
                          f"(set {flags.text_column})")


def iter_documents(path: str, *, name: str = "", split: str = "train", data_files: str = "", streaming: bool = False,
                   text_column: str = "text", shard: tuple[int, int] = (0, 1),
                   flags: Flags = CONFIG_FLAGS) -> Iterator[Document]:
    """The split's documents in the dataset's order (this process's part of them with `shard`); examples without
    text are skipped. `flags`: the options the errors name."""
    dataset = load(path, name=name, split=split, data_files=data_files, streaming=streaming, flags=flags)
    check_column(dataset, text_column, path, flags)
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
