"""Pretraining corpora: text files and named TFDS datasets -> documents -> token ids (Hugging Face Hub datasets:
pretrain/data/hub.py).

A corpus is a list of documents; a document is a list of sentences (or lines). This is the
layout BERT's `create_pretraining_data.py` reads (one sentence per line, blank lines between
documents), and what NSP / sentence-order objectives need: they pair sentences *within* a document.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pretrain.runtime.errors import UserError

Document = list[str]  # a document's sentences / lines, in order

_TFDS_BATCH = 1024  # examples fetched per random-access read; amortises array_record lookups
_ENCODE_BATCH = 8192  # sentences per tokenizer call; big enough for its thread pool, bounded memory


class CorpusError(UserError):  # UserError is a ValueError; main prints it as one line
    """A corpus (or tokenizer file) a person must fix; the message names the thing and the fix."""


# ----------------------------------------------------------------------------------------------
# Text files.


def _expand_paths(paths: str | Sequence[str], flag: str = "--config.data.path") -> list[str]:
    """Comma-separated string or list of paths/globs -> existing files, in the given order; `flag` is
    named in the errors."""
    if isinstance(paths, str):
        paths = paths.split(",")
    patterns = [os.path.expanduser(p.strip()) for p in paths if p.strip()]
    if not patterns:
        raise CorpusError(f"no corpus path given (set {flag} to text files or a glob)")
    files = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))  # sorted: file order must not depend on the filesystem
            if not matches:
                raise CorpusError(f"no corpus file matches {pattern} (check {flag})")
            if all(os.path.isdir(m) for m in matches):
                raise CorpusError(f"{pattern} matches only directories ({matches[0]}, ...), no files: give files or "
                                  f"a glob of files in {flag} (e.g. {os.path.join(matches[0], '*.txt')})")
            files.extend(m for m in matches if not os.path.isdir(m))  # dir/* may also match subdirectories
        elif os.path.isfile(pattern):
            files.append(pattern)
        elif os.path.isdir(pattern):
            raise CorpusError(f"corpus path {pattern} is a directory: give its files or a glob in {flag} "
                              f"(e.g. {os.path.join(pattern, '*.txt')})")
        else:
            raise CorpusError(f"corpus file not found: {pattern} (check {flag})")
    for path in files:
        _check_text(path, flag)
    return files


def _check_text(path: str, flag: str) -> None:
    """A binary file (a checkpoint, an archive, a model) given as corpus: NUL bytes never occur in text."""
    with open(path, "rb") as f:
        head = f.read(8192)
    if b"\0" in head:
        in_config = flag.startswith("--config.")
        prepared = " (a prepared corpus goes with --config.data.source=prepared)" if in_config else ""
        raise CorpusError(f"corpus file {path} is binary, not text (it has NUL bytes); give UTF-8 text files in {flag}"
                          + prepared)


def _split_documents(lines) -> Iterator[Document]:
    """Blank lines end a document; leading/trailing whitespace is noise."""
    current = []
    for line in lines:
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            yield current
            current = []
    if current:
        yield current


def iter_text_documents(paths: str | Sequence[str], flag: str = "--config.data.path") -> Iterator[Document]:
    """Streams the documents of text files, one at a time (memory: one document, whatever the files' size).

    The paths are checked now (a missing file is an error before anything is read); a file's end also ends
    its last document, so documents never span files.
    """
    return _file_documents(_expand_paths(paths, flag))


def _file_documents(files: list[str]) -> Iterator[Document]:
    for path in files:
        # errors="replace": one bad byte in a web crawl should not kill a multi-day job.
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from _split_documents(f)


def read_text_corpus(paths: str | Sequence[str], flag: str = "--config.data.path") -> list[Document]:
    """Reads text files: one sentence per line, documents separated by blank lines.

    `paths` is a path, a glob, a comma-separated string of them, or a list. A file's end also
    ends its last document, so documents never span files. `flag`: how the user gave `paths` (for errors).
    """
    files = _expand_paths(paths, flag)
    documents = list(_file_documents(files))
    if not documents:
        shown = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more files)"
        raise CorpusError(
            f"corpus {shown} is empty: it has no non-blank lines; give a text file with one sentence"
            " per line and blank lines between documents"
        )
    return documents


def read_raw_text(paths: str | Sequence[str], flag: str = "--config.data.path") -> str:
    """The files' text verbatim (newlines and blank lines kept), concatenated in the given order."""
    files = _expand_paths(paths, flag)
    parts = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    text = "".join(parts)
    if not text:
        raise CorpusError(f"corpus {', '.join(files)} is empty; check {flag}")
    return text

def split_tail(text: str, fraction: float) -> tuple[str, str]:
    """(head, tail): the last `fraction` of the characters held out, nanoGPT's prepare.py split
    (train = data[:int(n * 0.9)], val = data[int(n * 0.9):] for fraction 0.1)."""
    cut = int(len(text) * (1.0 - fraction))
    return text[:cut], text[cut:]

# ----------------------------------------------------------------------------------------------
# TFDS datasets.


def _tfds_builder(name: str, data_dir: str | None):
    import tensorflow_datasets as tfds  # optional dependency (extra "tfds"): import only when used

    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        # TFDS's own message lists every dataset it knows: thousands of lines.
        where = data_dir or "~/tensorflow_datasets"
        raise CorpusError(
            f"TFDS dataset {name!r} not found in the catalog or under {where} (check"
            " --config.data.tfds_name, e.g. 'wikipedia/20230601.en', and --config.data.tfds_data_dir)"
        ) from None


def _tfrecord_examples(builder, split: str, name: str):
    """Sequential fallback for datasets prepared as tfrecord; needs TensorFlow to parse them."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        raise CorpusError(
            f"TFDS dataset {name!r} at {builder.data_dir} is stored as tfrecord, which needs"
            " TensorFlow: `pip install tensorflow`, or re-prepare it with"
            " builder.download_and_prepare(file_format='array_record')"
        ) from None
    import tensorflow_datasets as tfds

    return tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))


def _array_record_examples(source, limit: int):
    for start in range(0, limit, _TFDS_BATCH):
        indices = list(range(start, min(start + _TFDS_BATCH, limit)))
        yield from source.__getitems__(indices)  # one batched read instead of len(indices) reads


def as_text(value: Any) -> str:
    """A dataset's text field as str: TFDS gives bytes, the Hub str."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def to_document(text: Any) -> Document:
    """A document's text (str or bytes; None: no text) -> its non-blank lines."""
    if text is None:
        return []
    return [line.strip() for line in as_text(text).split("\n") if line.strip()]


def iter_tfds_documents(
    name: str,
    *,
    split: str = "train",
    data_dir: str | None = None,
    text_key: str = "text",
) -> Iterator[Document]:
    """Streams a TFDS text dataset's documents: each example's `text_key` field is one document of lines.

    Prepares the dataset (as array_record, which needs the network for real datasets) if it is not
    prepared yet, and checks the feature and split now; then reads in index order, so the corpus is
    the same on every host and every run. Examples without text are skipped.
    """
    builder = _tfds_builder(name, data_dir)
    if not builder.is_prepared():
        # array_record gives random access without TensorFlow; tfrecord (the TFDS default) does not.
        try:
            builder.download_and_prepare(file_format="array_record")
        except ModuleNotFoundError as e:
            # tfds 4.9 imports importlib_resources on every Python but declares it only for < 3.9.
            raise CorpusError(
                f"preparing TFDS dataset {name!r} needs the module {e.name}"
                f" (`pip install {e.name}`, or prepare it where it is installed)"
            ) from e
    features = builder.info.features
    if text_key not in features:
        raise CorpusError(
            f"TFDS dataset {name!r} has no feature {text_key!r} (its features are"
            f" {sorted(features.keys())}; set --config.data.text_key)"
        )
    # Split strings may slice and add ("train[:1%]+validation"); check only their base names.
    unknown = {re.sub(r"\[.*\]", "", s).strip() for s in split.split("+")} - set(builder.info.splits)
    if unknown:
        raise CorpusError(
            f"TFDS dataset {name!r} has no split {sorted(unknown)[0]!r} (its splits are"
            f" {sorted(builder.info.splits.keys())}; set --config.data.tfds_split)"
        )

    try:
        source = builder.as_data_source(split=split)
    except NotImplementedError:  # no random-access format on disk
        examples = _tfrecord_examples(builder, split, name)
    else:
        examples = _array_record_examples(source, len(source))  # lazy: a consumer may stop early
    return (document for document in map(to_document, (e[text_key] for e in examples)) if document)


def read_tfds_corpus(
    name: str,
    *,
    split: str = "train",
    data_dir: str | None = None,
    text_key: str = "text",
    max_documents: int | None = None,
) -> list[Document]:
    """iter_tfds_documents as a list: the first `max_documents` documents with text (all if None)."""
    documents = list(itertools.islice(
        iter_tfds_documents(name, split=split, data_dir=data_dir, text_key=text_key), max_documents))
    if not documents:
        raise CorpusError(
            f"TFDS dataset {name!r} split {split!r} has no text in feature {text_key!r}"
            " (check --config.data.tfds_split and --config.data.text_key)"
        )
    return documents


# ----------------------------------------------------------------------------------------------
# Tokenization.


def encode_documents(documents: Sequence[Document], tokenizer) -> list[list[np.ndarray]]:
    """Sentences -> int32 id arrays (no special tokens); drops empty sentences and documents.

    All sentences go through `tokenizer.encode_batch` in large batches: the backends (sentencepiece,
    Hugging Face tokenizers) encode a batch in parallel C++ threads, a per-sentence loop does not.
    """
    flat = [sentence for document in documents for sentence in document]
    ids = []
    for start in range(0, len(flat), _ENCODE_BATCH):
        ids.extend(tokenizer.encode_batch(flat[start : start + _ENCODE_BATCH]))

    out, cursor = [], 0
    for document in documents:
        sentences = [np.asarray(s, np.int32) for s in ids[cursor : cursor + len(document)] if len(s)]
        cursor += len(document)
        if sentences:
            out.append(sentences)
    return out


def tokenize_documents(documents: list[Document], tokenizer) -> list[list[np.ndarray]]:
    """encode_documents, and an error if nothing is left."""
    out = encode_documents(documents, tokenizer)
    if not out:
        raise CorpusError(
            f"tokenizing {len(documents)} documents left no tokens (the corpus is empty or the"
            " tokenizer maps all of it to nothing; check the corpus path and tokenizer file)"
        )
    return out
