"""ALBERT pretraining (Lan et al., 2020): BERT with factorised embeddings, one layer shared across depth and
sentence-order prediction (SOP) in place of NSP. It is the "bert" model family with these settings, so GLUE,
tagging, QA and PEFT fine-tune an ALBERT run (or a Hugging Face ALBERT directory) as they do BERT.

Launch (demo corpus and tokenizer come from `make demo`):
  python -m pretrain.train --config=configs/albert.py:size=tiny --workdir=runs/albert_tiny
  python -m pretrain.finetune --config=configs/glue.py:task=sst2 --config.init=runs/albert_tiny \
      --workdir=runs/albert_tiny_sst2
  python -m pretrain.train --config=configs/albert.py:size=base --workdir=/gcs/bucket/albert_base \
      --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en \
      --config.tokenizer.path=spiece.model
  python -m pretrain.tools.export_hf_bert --workdir runs/albert_tiny --output hf/albert_tiny  # AlbertForPreTraining

Config string: `size=tiny|base|large|xlarge` (default base), `recipe=paper|short` (tiny defaults to short: the
demo corpus, its 8000-piece SentencePiece model and sequences of 128, as configs/bert.py's tiny).

Sizes (paper Table 1; Hugging Face's albert-*-v2 configs): layers / hidden H / embedding E / heads / FFN
  base 12 / 768 / 128 / 12 / 3072, large 24 / 1024 / 128 / 16 / 4096, xlarge 24 / 2048 / 128 / 16 / 8192;
  tiny 2 / 128 / 64 / 2 / 512 (tests and the demo).
Exact parameter counts of AlbertForPreTraining at vocab 30000 (ours equal transformers', the tied decoder counted
once; tests/models/test_albert.py checks both): tiny 2,214,770, base 11,813,810 (paper: "12M"),
large 17,847,474 (paper: "18M"), xlarge 59,021,490 (paper: "60M").
Model: vocab 30000 (SentencePiece, lowercased), 512 positions, GELU's tanh form (gelu_new), no dropout (the
paper removes it; the v2 checkpoints have dropout 0), LayerNorm eps 1e-12.

The paper recipe (Section 4.1): batch 4096, LAMB (pretrain/training/optimizers.py's `lamb`, as ALBERT's
lamb_optimizer.py: b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 and the trust ratio on every weight but LayerNorm
parameters and biases) with learning rate 0.00176, 125,000 steps, sequences of 512 (10% shorter: short_seq_prob
0.1), 20 masked positions per sequence. The warm-up is 3,125 steps (ALBERT's released run_pretraining flags).
Both recipes mask as the paper does: n-grams of up to 3 whole words, P(n) proportional to 1/n (6/11, 3/11, 2/11),
each token of an n-gram 80% [MASK], 10% random, 10% unchanged (drawn per token, as ALBERT's
create_pretraining_data.py): objective.masking="ngrams" (objectives/bert_pretraining.py).
The short recipe keeps configs/bert.py's AdamW at lr 1e-3 and batch 32: LAMB's rate is set for a batch of 4096.
Target: ALBERT-base v1 SQuAD 1.1 F1 89.3, MNLI 81.6, SST-2 90.3 (paper Table 2, the average over its tasks 80.1).
"""
import ml_collections

from configs import bert, common

SIZES = {  # name: (layers, hidden, embedding, heads, ffn)
    "tiny": (2, 128, 64, 2, 512),
    "base": (12, 768, 128, 12, 3072),
    "large": (24, 1024, 128, 16, 4096),
    "xlarge": (24, 2048, 128, 16, 8192),
}
PAPER = {  # flattened overrides of configs/bert.py's paper recipe
    "batch_size": 4096, "num_train_steps": 125_000, "optimizer.name": "lamb", "optimizer.learning_rate": 0.00176,
    "optimizer.warmup_steps": 3125, "checkpoint_every": 5000, "eval_every": 5000,
    "data.max_seq_length": 512, "data.long_seq_length": 0, "objective.max_predictions_per_seq": 20,
    "model.vocab_size": 30000, "tokenizer.kind": "sentencepiece", "tokenizer.lowercase": True,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="base", recipe="")
    if arg.size not in SIZES:
        raise ValueError(f"configs/albert.py: size={arg.size!r} is not one of {list(SIZES)}")
    recipe = arg.recipe or ("short" if arg.size == "tiny" else "paper")
    if recipe not in ("paper", "short"):
        raise ValueError(f"configs/albert.py: recipe={recipe!r} must be one of ['paper', 'short']")
    layers, hidden, embedding, heads, ffn = SIZES[arg.size]
    c = bert.get_config(f"size=base,nsp=True,recipe={recipe}")
    with c.unlocked():
        c.model.update(dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=ffn,
                            dropout_rate=0.0, attention_dropout_rate=0.0))
        c.model.embedding_size = embedding   # E: V x E tables, then one E -> H projection
        c.model.shared_layers = True         # one layer's weights at every depth
        c.model.hidden_act = "gelu_new"      # GELU's tanh form, as ALBERT's code and checkpoints
    c.objective.sentence_order = True        # SOP pairs through the NSP head (objectives/nsp.py)
    c.objective.masking = "ngrams"           # n-grams of up to ngram_max (3) words, P(n) ~ 1/n
    c.objective.whole_word_masking = True    # ... of whole words (ALBERT's do_whole_word_mask)
    if recipe == "paper":
        c.update_from_flattened_dict(PAPER)
    c.lock()
    return c
