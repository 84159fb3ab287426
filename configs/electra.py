"""ELECTRA pretraining (Clark et al., 2020): replaced-token detection by a discriminator, a small generator
sharing its embeddings, loss = MLM(generator) + 50 * BCE(discriminator).

Launch (demo corpus and tokenizer come from `make demo`):
  python -m pretrain.train --config=configs/electra.py:size=tiny --workdir=runs/electra_tiny
  python -m pretrain.finetune --config=configs/glue.py:task=sst2 --config.init=runs/electra_tiny \
      --workdir=runs/electra_tiny_sst2          # the discriminator fine-tunes as a BERT
  python -m pretrain.train --config=configs/electra.py:size=small --workdir=/gcs/bucket/electra_small \
      --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en \
      --config.tokenizer.kind=wordpiece --config.tokenizer.path=vocab.txt

Config string: `size=tiny|small|base|large` (default small), `recipe=paper|short` (tiny defaults to
short, the others to paper).

Sizes and recipe: the paper's Table 6 (hyper-parameters) and Section 3.2. The discriminator is BERT's
encoder with factorised embeddings (Small: E = 128 < H = 256) and no pooler; the generator has the same
depth at 1/4 of the width (Small, Large) or 1/3 (Base), and shares the token, position and token-type
embeddings. Masking: 15% of the tokens (25% for Large), of which 85% [MASK] and 15% kept, none random.
Adam (b1 0.9, b2 0.999, eps 1e-6), weight decay 0.01, 10,000 warm-up steps then linear decay,
dropout 0.1. Small: batch 128, lr 5e-4, 1M steps, 128 tokens. Base: batch 256, lr 2e-4, 766K steps,
512 tokens. Large: batch 2048, lr 2e-4, 400K steps, 512 tokens.

Parameter counts of the discriminator (Hugging Face's ElectraForPreTraining, equal here; paper: Small
14M, Base 110M, Large 335M), and of the generator beyond the shared embeddings: small 13,549,313 and
+1,326,858 ... see docs/electra.md for every size. Targets: GLUE dev score 79.9 (Small, Table 1; BERT-Small
of equal compute 75.1), 85.1 (Base, Table 8), 89.0 (Large); our equal-budget comparison on this machine is
in docs/electra.md.
"""
import ml_collections

from configs import bert, common

SIZES = {  # name: (layers, hidden, heads, ffn, embedding size, generator hidden, generator heads, generator ffn)
    "tiny": (2, 128, 2, 512, 128, 32, 1, 128),
    "small": (12, 256, 4, 1024, 128, 64, 1, 256),
    "base": (12, 768, 12, 3072, 768, 256, 4, 1024),
    "large": (24, 1024, 16, 4096, 1024, 256, 4, 1024),
}
PAPER = {  # the paper's Table 6, flattened overrides of configs/bert.py's paper recipe
    "small": {"batch_size": 128, "optimizer.learning_rate": 5e-4, "num_train_steps": 1_000_000,
              "data.max_seq_length": 128, "objective.max_predictions_per_seq": 20},
    "base": {"batch_size": 256, "optimizer.learning_rate": 2e-4, "num_train_steps": 766_000,
             "data.max_seq_length": 512, "objective.max_predictions_per_seq": 80},
    "large": {"batch_size": 2048, "optimizer.learning_rate": 2e-4, "num_train_steps": 400_000,
              "data.max_seq_length": 512, "objective.max_predictions_per_seq": 131, "objective.mask_prob": 0.25},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="small", recipe="")  # the paper's headline: Small, one GPU, four days
    if arg.size not in SIZES:
        raise ValueError(f"configs/electra.py: size={arg.size!r} is not one of {list(SIZES)}")
    recipe = arg.recipe or ("short" if arg.size == "tiny" else "paper")
    if recipe not in ("paper", "short"):
        raise ValueError(f"configs/electra.py: recipe={recipe!r} must be paper or short")
    if recipe == "paper" and arg.size == "tiny":
        raise ValueError("configs/electra.py: size=tiny has no paper recipe; use recipe=short")
    layers, hidden, heads, ffn, embedding, gen_hidden, gen_heads, gen_ffn = SIZES[arg.size]
    c = bert.get_config(f"size=tiny,nsp=False,recipe={recipe}")  # BERT's trainer, data and recipe fields
    with c.unlocked():
        c.model.update(dict(name="electra", num_layers=layers, hidden_size=hidden, num_heads=heads,
                            intermediate_size=ffn))
        c.model.embedding_size = embedding
        c.model.generator_hidden_size = gen_hidden
        c.model.generator_num_heads = gen_heads
        c.model.generator_intermediate_size = gen_ffn
        c.model.generator_num_layers = 0       # 0: the discriminator's depth
        c.model.sampling_temperature = 1.0
        c.objective = ml_collections.ConfigDict(dict(
            name="electra", mask_prob=0.15, replace_with_mask=0.85, replace_with_random=0.0,
            max_predictions_per_seq=20, long_max_predictions_per_seq=80, whole_word_masking=False,
            next_sentence=c.objective.get_ref("next_sentence"), short_seq_prob=0.1,
            disc_weight=50.0))  # the paper's lambda
    if recipe == "paper":
        c.update_from_flattened_dict({"optimizer.warmup_steps": 10_000, "data.long_seq_length": 0, **PAPER[arg.size]})
    c.lock()
    return c
