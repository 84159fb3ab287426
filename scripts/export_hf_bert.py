"""Exports a BERT checkpoint of ours to a Hugging Face directory (config.json + model.safetensors).

  python scripts/export_hf_bert.py --workdir runs/bert_base --output hf/bert_base
  python -c "from transformers import BertForPreTraining; BertForPreTraining.from_pretrained('hf/bert_base')"

--workdir is a pretrain.train workdir (the latest checkpoint, or --step); a pretrain.finetune
workdir exports its encoder. A WordPiece vocab.txt is copied beside the weights; a SentencePiece
model is not a format transformers' BertTokenizer reads, so it is left out with a note.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from models.convert import save_hf_bert  # noqa: E402
import models  # noqa: E402
from pretrain.core import checkpoints  # noqa: E402
from pretrain.core import errors  # noqa: E402


def export(workdir: str, output: str, step: int | None = None) -> str:
    config_path = os.path.join(workdir, "config.json")
    if not os.path.isfile(config_path):
        raise errors.UserError(f"{config_path} not found: --workdir must be a pretrain.train or "
                               "pretrain.finetune workdir")
    with open(config_path) as f:
        config = json.load(f)
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
    # Pretraining heads travel along; a fine-tuned task head has no BERT-architecture home in transformers.
    params = {k: v for k, v in params.items() if k in ("bert", "mlm_head", "nsp_head")}
    model = models.model_config({**config["model"], "next_sentence": "nsp_head" in params})
    tokenizer = config.get("tokenizer", {})
    vocab = None
    if tokenizer.get("kind") == "wordpiece":
        path = tokenizer["path"]
        vocab = os.path.join(path, "vocab.txt") if os.path.isdir(path) else path
    save_hf_bert(output, params, model, vocab_file=vocab, lowercase=tokenizer.get("lowercase", True))
    if vocab is None:
        print(f"note: the SentencePiece tokenizer {tokenizer.get('path')} is not copied (transformers' BertTokenizer "
              "reads WordPiece vocab.txt files only)")
    return f"exported {workdir} step {step} ({', '.join(params)}) to {output}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    args = parser.parse_args()
    with errors.one_line_errors():
        print(export(args.workdir, args.output, args.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
