"""ModernBERT pretraining (Warner et al. 2024): masked LM at 30% masking, no NSP, at the published sizes and CPU ones.

Launch (the demo corpus and tokenizer come from `make demo`):
  python -m pretrain.train --config=configs/modernbert.py:size=tiny --workdir=runs/modernbert_tiny
  python -m pretrain.train --config=configs/modernbert.py:size=base --workdir=gs://bucket/modernbert_base \
      --config.data.source=prepared --config.data.path=gs://bucket/corpus \
      --config.tokenizer.kind=hf_json --config.tokenizer.path=ModernBERT-base/tokenizer.json
Fine-tuning: configs/glue.py:task=mrpc,model=modernbert (and configs/tagging.py, configs/qa.py), with
--config.init a pretrain.train workdir or a Hugging Face ModernBERT directory (config.json, model.safetensors,
tokenizer.json). `python -m pretrain.tools.export_hf_bert` writes a run as a ModernBertForMaskedLM directory.

Config string: `size=tiny|mini|small|base|large`, `recipe=paper|short` (tiny and mini default to short, the demo
corpus on a laptop CPU), `packing=True|False` (rows packed with several documents, attention kept inside each by
segment ids: the TPU's equivalent of ModernBERT's unpadding).

Targets. base and large are the released models' shapes (answerdotai/ModernBERT-base, -large): parameter counts of
ModernBertForMaskedLM, here and in transformers, 149,655,232 and 395,881,664 (the paper: 149M, 395M). Every third
layer global (RoPE theta 160,000), the others a 128-token sliding window (theta 10,000). The paper recipe
(Section 2.2 and Appendix): 30% masking, StableAdamW (here AdamW with clipping) lr 8e-4 (base) / 5e-4 (large),
weight decay 1e-5, a warmup-stable-decay schedule, 1,024 tokens then 8,192, 2 trillion tokens; ModernBERT-base
reaches GLUE 88.4.
"""
import ml_collections

from configs import common

SIZES = {  # name: (layers, hidden, heads, GeGLU inner width)
    "tiny": (3, 128, 2, 256),
    "mini": (4, 256, 4, 384),
    "small": (6, 512, 8, 768),
    "base": (22, 768, 12, 1152),
    "large": (28, 1024, 16, 2624),
}
SMALL_SIZES = ("tiny", "mini")

RECIPES = {  # flattened overrides of the fields below
    "paper": {  # Warner et al. (2024), base; the large model's peak is 5e-4
        "batch_size": 4608, "num_train_steps": 400_000, "optimizer.learning_rate": 8e-4,
        "optimizer.warmup_steps": 3_000, "optimizer.weight_decay": 1e-5, "optimizer.b2": 0.98,
        "log_every": 100, "checkpoint_every": 10_000, "eval_every": 10_000, "data.max_seq_length": 1024,
    },
    "short": {  # a few minutes on a laptop CPU with the demo corpus of `make demo`
        "batch_size": 32, "num_train_steps": 600, "optimizer.learning_rate": 2e-3,
        "optimizer.warmup_steps": 60, "log_every": 10, "checkpoint_every": 200, "eval_every": 200,
        "data.path": "demo_out/corpus.txt", "data.eval_documents": 20,
        "tokenizer.kind": "sentencepiece", "tokenizer.path": "demo_out/tokenizer/spm.model", "model.vocab_size": 8000,
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="base", recipe="", packing=False)
    if arg.size not in SIZES:
        raise ValueError(f"configs/modernbert.py: size={arg.size!r} is not one of {list(SIZES)}")
    recipe = arg.recipe or ("short" if arg.size in SMALL_SIZES else "paper")
    if recipe not in RECIPES:
        raise ValueError(f"configs/modernbert.py: recipe={recipe!r} must be one of {list(RECIPES)}")
    layers, hidden, heads, ffn = SIZES[arg.size]

    c = common.trainer_config()
    c.model = ml_collections.ConfigDict(dict(
        name="modernbert", vocab_size=50368, hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=ffn, max_position_embeddings=8192, global_attn_every_n_layers=3, local_attention=128,
        global_rope_theta=160_000.0, local_rope_theta=10_000.0, norm_eps=1e-5,
        embedding_dropout=0.0, dropout_rate=0.0, attention_dropout_rate=0.0,
        initializer_range=0.02, initializer_cutoff_factor=2.0, hidden_act="gelu", classifier_activation="gelu",
        classifier_pooling="mean", decoder_bias=True, dtype="float32", param_dtype="float32",
        **common.compute_fields()))
    # classifier_pooling: what a fine-tuning head of this run's checkpoints reads (a Hugging Face directory brings its
    # own; transformers' class default is cls). Mean: masked LM never trains the [CLS] position's output, whose frozen
    # vector probes as random weights' does, while the mean of the tokens carries what was learnt (docs/transfer.md).

    # BERT's masked LM without NSP, at ModernBERT's 30%; the loss is on the masked positions only (sparse prediction)
    c.objective = ml_collections.ConfigDict(dict(
        name="bert_pretraining", mask_prob=0.3, replace_with_mask=0.8, replace_with_random=0.1,
        max_predictions_per_seq=int(0.3 * 128) + 1, long_max_predictions_per_seq=int(0.3 * 1024) + 1,
        whole_word_masking=False, next_sentence=False, short_seq_prob=0.0, masking="tokens", ngram_max=3,
        sentence_order=False, packing=arg.packing,
        eval_mask_prob=0.0))  # the held-out batches' masking rate (0: mask_prob)

    c.optimizer.schedule = "warmup_stable_decay"
    c.optimizer.decay_fraction = 0.1   # the last 10% of the steps decay (1 - sqrt) to end_learning_rate
    c.data = ml_collections.ConfigDict(dict(
        **common.corpus_fields(),
        max_seq_length=128,
        long_seq_length=0,           # a second phase at this length (the paper's 8,192 context extension)
        long_seq_start_step=0,
        **common.input_pipeline_fields()))
    c.tokenizer = ml_collections.ConfigDict(dict(kind="hf_json", path="", lowercase=False))

    c.update_from_flattened_dict(RECIPES[recipe])
    c.objective.max_predictions_per_seq = int(c.objective.mask_prob * c.data.max_seq_length) + 1
    c.lock()
    return c
