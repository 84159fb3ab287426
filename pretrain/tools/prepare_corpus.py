"""Tokenizes a corpus once into ArrayRecord shards that pretraining reads with --config.data.source=prepared.

  python -m pretrain.tools.prepare_corpus --input 'books/*.txt' --tokenizer out/spm.model --output prepared/books \
      --num_shards 8 [--eval_documents 100] [--workers N] [--max_documents M]
  python -m pretrain.tools.prepare_corpus --tfds wikipedia/20230601.en [--tfds_data_dir DIR] [--text_key text] \
      --tokenizer vocab.txt --tokenizer_kind wordpiece --output prepared/wiki --num_shards 256
  python -m pretrain.tools.prepare_corpus --hf HuggingFaceFW/fineweb-edu --hf_name sample-10BT --streaming \
      --tokenizer tokenizer.json --tokenizer_kind hf_json --output prepared/fineweb --num_shards 256

--input is the text format of --config.data.source=text (one sentence per line, blank lines between
documents; paths, globs or comma-separated lists); --tfds a dataset as --config.data.source=tfds reads it; --hf a
Hugging Face Hub dataset (or a local folder in its layout) as --config.data.source=hf reads it.
Both are streamed (read twice: counted, then tokenized on --workers processes), so memory stays bounded
whatever the corpus size. The layout is pretrain/data/prepared.py's; index.json, written last, records the
counts, the tokenizer's fingerprint and this command.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import argparse
import functools
import os
import shlex
import sys

from pretrain.data import hub, preparation, prepared, sources, tokenizers
from pretrain.runtime import errors

# This command's flags, for the fixes the Hub's errors name.
HUB_FLAGS = hub.Flags(path="--hf", name="--hf_name", split="--hf_split", data_files="--data_files",
                      text_column="--text_column", first_documents="--max_documents=N",
                      not_streaming="drop --streaming")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus = parser.add_mutually_exclusive_group(required=True)
    corpus.add_argument("--input", nargs="+", help="text files or globs, one sentence a line")
    corpus.add_argument("--tfds", help="a TFDS text dataset, e.g. wikipedia/20230601.en")
    parser.add_argument("--tfds_data_dir", default=None)
    parser.add_argument("--tfds_split", default="train")
    parser.add_argument("--text_key", default="text", help="the TFDS feature holding a document")
    corpus.add_argument("--hf", help="a Hugging Face Hub dataset (owner/name) or a local folder in the Hub's layout")
    parser.add_argument("--hf_name", default="", help="the Hub dataset's config, e.g. 20231101.en")
    parser.add_argument("--hf_split", default="train")
    parser.add_argument("--data_files", default="", help="the Hub dataset's files to read (globs, comma-separated)")
    parser.add_argument("--text_column", default="text", help="the Hub dataset's column holding a document")
    parser.add_argument("--streaming", action="store_true",
                        help="read the Hub dataset as a stream (no Arrow copy of the split on disk)")
    parser.add_argument("--tokenizer", required=True, help="the tokenizer file (as --config.tokenizer.path)")
    parser.add_argument("--tokenizer_kind", choices=tokenizers.TOKENIZERS.names(), default="sentencepiece")
    parser.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                        help="as --config.tokenizer.lowercase (sentencepiece, wordpiece)")
    parser.add_argument("--extra_ids", type=int, default=0, help="as --config.tokenizer.extra_ids (T5: 100)")
    parser.add_argument("--output", required=True, help="a new or empty directory (or an earlier preparation's)")
    parser.add_argument("--num_shards", type=int, required=True)
    parser.add_argument("--eval_documents", type=int, default=0, help="hold out the last K documents as 'eval'")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes")
    parser.add_argument("--max_documents", type=int, default=0, help="read only the first M documents (0: all)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, command: str = "") -> dict:
    """The preparation `args` describe; returns the index written."""
    if args.input:
        documents = functools.partial(sources.iter_text_documents, args.input, flag="--input")
        source = {"input": args.input}
    elif args.hf:
        hub.check_split(args.hf_split, args.streaming, HUB_FLAGS)  # before the tokenizer and the dataset are opened
        source = {"hf": args.hf, "hf_name": args.hf_name, "hf_split": args.hf_split, "data_files": args.data_files,
                  "text_column": args.text_column, "streaming": args.streaming}
        documents = functools.partial(hub.iter_documents, args.hf, name=args.hf_name, split=args.hf_split,
                                      data_files=args.data_files, streaming=args.streaming,
                                      text_column=args.text_column, flags=HUB_FLAGS)
    else:
        documents = functools.partial(sources.iter_tfds_documents, args.tfds, split=args.tfds_split,
                                      data_dir=args.tfds_data_dir, text_key=args.text_key)
        source = {"tfds": args.tfds, "tfds_split": args.tfds_split, "tfds_data_dir": args.tfds_data_dir,
                  "text_key": args.text_key}
    tokenizer = {"kind": args.tokenizer_kind, "path": args.tokenizer, "lowercase": args.lowercase,
                 "extra_ids": args.extra_ids}
    return preparation.prepare(documents, tokenizer, args.output, num_shards=args.num_shards,
                               eval_documents=args.eval_documents, workers=args.workers,
                               max_documents=args.max_documents, source=source, command=command,
                               progress=not args.no_progress)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    with errors.one_line_errors():
        index = run(args, command=shlex.join(["python", "-m", "pretrain.tools.prepare_corpus", *argv]))
        for split, summary in index["splits"].items():
            print(f"{split:5s} {summary['documents']:>12,} documents {summary['tokens']:>15,} tokens"
                  f" in {len(summary['shards'])} shards")
        print(f"wrote {os.path.join(args.output, prepared.INDEX)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
