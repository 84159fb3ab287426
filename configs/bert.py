"""BERT pretraining (masked LM + next sentence prediction) at every published size.

Launch (demo corpus and tokenizer come from `make demo`):
  python -m pretrain.train --config=configs/bert.py:size=tiny --workdir=runs/bert_tiny
  python -m pretrain.train --config=configs/bert.py:size=base --workdir=/gcs/bucket/bert_base \
      --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en \
      --config.tokenizer.kind=wordpiece --config.tokenizer.path=vocab.txt

Config string: `size=tiny|mini|small|medium|base|large`, `nsp=True|False` (False = RoBERTa-style
MLM only), `wwm=True|False` (whole-word masking), `recipe=paper|short|cram` (cram: scripts/reproduce/cram.py's
budgeted recipe, docs/cram.md).

Targets. Sizes are Devlin et al. (2019) Table/Section 3 and the 24 "BERT miniatures" of
Turc et al. (2019) for tiny..medium. Exact parameter counts of BertForPreTraining here (they equal
Hugging Face's): base 110,106,428 (paper: "110M"), large 336,226,108 (paper: "340M"; the paper
rounds up: Hugging Face and Google's checkpoints have the same 336.2M). The paper recipe
(Section A.2): batch 256 sequences, Adam lr 1e-4, b1 0.9, b2 0.999, L2 weight decay 0.01, warmup
10,000 steps then linear decay, 1,000,000 steps, dropout 0.1, GELU, sequence length 128 for 90% of
the steps and 512 for the last 10% (max_predictions_per_seq 20 and 80). BERT-Base reaches an MLM
accuracy of about 0.70 and NSP accuracy of about 0.98 at the end of that recipe.
"""
import ml_collections

from configs import common

SIZES = {  # name: (layers, hidden, heads, ffn)
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
SMALL_SIZES = ("tiny", "mini")  # these default to the short recipe on the demo corpus

RECIPES = {  # flattened overrides of the fields below
    "paper": {  # Devlin et al. (2019), Section A.2
        "batch_size": 256, "num_train_steps": 1_000_000, "optimizer.learning_rate": 1e-4,
        "optimizer.warmup_steps": 10_000, "log_every": 100, "checkpoint_every": 10_000, "eval_every": 10_000,
    },
    "short": {  # a few minutes on a laptop CPU with the demo corpus of `make demo`
        "batch_size": 32, "num_train_steps": 1200, "optimizer.learning_rate": 1e-3,
        "optimizer.warmup_steps": 100, "log_every": 10, "checkpoint_every": 400, "eval_every": 400,
        "data.long_seq_length": 0, "data.path": "demo_out/corpus.txt", "data.eval_documents": 20,
        "tokenizer.kind": "sentencepiece", "tokenizer.path": "demo_out/tokenizer/spm.model",
        "model.vocab_size": 8000,
    },
    "cram": {  # scripts/reproduce/cram.py: a fixed wall-clock budget on a few CPU cores, nsp=False (docs/cram.md has
               # the measurements that chose it); cram.py sets the steps, the warm-up and the corpus and tokenizer
        "batch_size": 32, "num_train_steps": 1000, "optimizer.learning_rate": 1e-3,
        "optimizer.warmup_steps": 100, "log_every": 20, "checkpoint_every": 1000, "eval_every": 0,
        "eval_batches": 8, "data.long_seq_length": 0, "data.eval_documents": 50,
        "tokenizer.kind": "sentencepiece", "model.vocab_size": 8000,
        # Cramming (Geiping & Goldstein 2022): no dropout in a short pretraining; Wettig et al. (2023): 40% masking
        "model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
        "objective.mask_prob": 0.4, "objective.max_predictions_per_seq": 52,
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="base", nsp=True, wwm=False, recipe="")
    if arg.size not in SIZES:
        raise ValueError(f"configs/bert.py: size={arg.size!r} is not one of {list(SIZES)}")
    recipe = arg.recipe or ("short" if arg.size in SMALL_SIZES else "paper")
    if recipe not in RECIPES:
        raise ValueError(f"configs/bert.py: recipe={recipe!r} must be one of {list(RECIPES)}")
    layers, hidden, heads, ffn = SIZES[arg.size]

    c = common.trainer_config()
    c.model = ml_collections.ConfigDict(dict(
        name="bert", vocab_size=30522, hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=ffn, max_position_embeddings=512, type_vocab_size=2,
        dropout_rate=0.1, attention_dropout_rate=0.1, layer_norm_eps=1e-12,
        initializer_range=0.02, next_sentence=arg.nsp, dtype="float32", param_dtype="float32",
        embedding_size=0, shared_layers=False, hidden_act="gelu",  # BERT's; ALBERT's in configs/albert.py
        pre_norm=False,  # True: pre-LN blocks and a final LayerNorm (configs/cram.py's arm; no transformers export)
        **common.compute_fields()))

    c.objective = ml_collections.ConfigDict(dict(
        name="bert_pretraining",
        mask_prob=0.15, replace_with_mask=0.8, replace_with_random=0.1,
        max_predictions_per_seq=20, long_max_predictions_per_seq=80,
        whole_word_masking=arg.wwm, next_sentence=arg.nsp, short_seq_prob=0.1,
        masking="tokens", ngram_max=3,  # "ngrams": ALBERT's n-grams of up to ngram_max words (configs/albert.py)
        sentence_order=False,  # True: ALBERT's sentence-order pairs through the NSP head (configs/albert.py)
        eval_mask_prob=0.0))   # the held-out batches' masking rate (0: mask_prob's); configs/cram.py scores at 0.15
    # One switch for NSP: the model's head follows the objective's pairs and loss (setting either key sets both).
    c.model.next_sentence = c.objective.get_ref("next_sentence")

    c.data = ml_collections.ConfigDict(dict(
        **common.corpus_fields(),
        max_seq_length=128,
        long_seq_length=512,         # second phase at this length (0 = no second phase)
        long_seq_start_step=900_000,
        **common.input_pipeline_fields()))

    c.tokenizer = ml_collections.ConfigDict(dict(kind="wordpiece", path="", lowercase=True))

    c.update_from_flattened_dict(RECIPES[recipe])
    c.lock()
    return c
