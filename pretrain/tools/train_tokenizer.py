r"""Trains a SentencePiece tokenizer with the ids the BERT objectives expect.

  python -m pretrain.tools.train_tokenizer --input corpus.txt [more.txt ...] --model_prefix OUT/spm \
      --vocab_size 8000 [--model_type unigram|bpe] [--character_coverage 0.9995] \
      [--input_sentence_size N] [--no-lowercase]

Ids: pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4, then the learned pieces. No <s>/</s>: BERT
places [CLS]/[SEP] itself. As in ALBERT, [CLS] [SEP] [MASK] are *control* symbols, so a literal
"[MASK]" in corpus text is never encoded as the mask id; load with
`pretrain.data.tokenizers.load_tokenizer('sentencepiece', 'OUT/spm.model')`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

SPECIALS = ("[CLS]", "[SEP]", "[MASK]")  # ids 2, 3, 4: right after pad=0 and unk=1


def train_sentencepiece(
    inputs: str | Sequence[str],
    model_prefix: str,
    vocab_size: int,
    model_type: str = "unigram",
    *,
    character_coverage: float = 0.9995,
    input_sentence_size: int = 0,
    lowercase: bool = True,
    num_threads: int | None = None,
    seed_sentencepiece_size: int = 1_000_000,
    quiet: bool = True,
) -> str:
    """Trains `{model_prefix}.model` (and `.vocab`) on text files; returns the model's path.

    input_sentence_size: if > 0, train on that many randomly sampled lines (big corpora).
    lowercase: case-fold during normalisation (nmt_nfkc_cf), matching uncased BERT.
    """
    import sentencepiece as spm

    from pretrain.data.sources import CorpusError

    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    for path in inputs:
        if not os.path.isfile(path):
            raise CorpusError(f"tokenizer training file not found: {path} (check --input)")
    if model_type not in ("unigram", "bpe"):
        raise CorpusError(f"unknown --model_type {model_type!r} (use unigram or bpe)")
    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            input=inputs,
            model_prefix=model_prefix,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=0,
            unk_id=1,
            bos_id=-1,
            eos_id=-1,
            control_symbols=list(SPECIALS),
            normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            seed_sentencepiece_size=seed_sentencepiece_size,
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2 if quiet else 0,
        )  # 2: warnings and errors only
    except RuntimeError as e:
        # e.g. "INTERNAL: src/trainer_interface.cc(744) [...] Vocabulary size too high (8000). Please set it to
        # a value <= 3456."
        msg = " ".join(str(e).split())
        most = re.search(r"Vocabulary size (?:is )?too high.*<=\s*(\d+)", msg)
        if most:
            raise CorpusError(
                f"--vocab_size {vocab_size} is more than the text of {', '.join(inputs)} allows: sentencepiece"
                f" reports a maximum of {most.group(1)} (use --vocab_size {most.group(1)} or less, or give more"
                " text)"
            ) from None
        raise CorpusError(
            f"sentencepiece training on {inputs[0]} failed: {msg} (lower --vocab_size or give more text)"
        ) from None
    return model_prefix + ".model"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="text files, one sentence a line")
    parser.add_argument("--model_prefix", required=True, help="writes PREFIX.model, PREFIX.vocab")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--model_type", choices=("unigram", "bpe"), default="unigram")
    parser.add_argument("--character_coverage", type=float, default=0.9995)
    parser.add_argument(
        "--input_sentence_size", type=int, default=0, help="sample this many lines (0: use all)"
    )
    parser.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="case-fold text (uncased model); --no-lowercase keeps case",
    )
    args = parser.parse_args(argv)
    from pretrain.runtime import errors

    with errors.one_line_errors():  # a bad input is `error: <one line>` and exit status 2
        path = train_sentencepiece(
            args.input,
            args.model_prefix,
            args.vocab_size,
            args.model_type,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size,
            lowercase=args.lowercase,
        )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
