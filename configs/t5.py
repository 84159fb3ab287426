"""T5 pretraining (span corruption on C4) at every published size, T5 1.0 and T5 1.1.

Launch (the demo corpus and tokenizer come from `make demo`):
  python -m pretrain.train --config=configs/t5.py:size=tiny --workdir=runs/t5_tiny
  python -m pretrain.train --config=configs/t5.py:size=base --workdir=/gcs/bucket/t5_base \
      --config.tokenizer.path=gs://t5-data/vocabs/cc_all.32000/sentencepiece.model

Config string: `size=tiny|small|base|large|3b|11b` (1.1 also `xl|xxl`; 3b and 11b are their
aliases there), `version=1.0|1.1`, `recipe=paper|released|short` (default: short for tiny, else paper).

Sizes. T5 1.0: Raffel et al. (2020), JMLR 21, Section 3.7 "Model sizes" (Base: Section 3.1.1).
T5 1.1: the T5 repository's released_checkpoints.md ("t5.1.1") and its gin configs: gated-GELU
FFN, no parameter sharing between the embedding and the output layer, relative attention as 1.0.
Exact parameter counts of T5ForConditionalGeneration here, equal to Hugging Face's for the same
config (tests/models/test_t5_configs.py; vocab 32,128):
  1.0  small     60,506,624 (paper "60M")    base    222,903,552 ("220M")   large 737,668,096 ("770M")
       3b     2,851,598,336 ("3B", "2.8B")   11b  11,307,321,344 ("11B")
  1.1  small     76,961,152 (released "77M") base    247,577,856 ("248M")   large 783,150,080 ("783M")
       xl     2,849,757,184 ("2.85B")        xxl  11,135,332,352 ("11.1B")
The paper's figures are rounded: its "770M" for Large is 4.2% above the count of its own released
checkpoint (737.7M, what Hugging Face's t5-large holds too).

Recipe `paper` (the baseline of Section 3.1.2, with the span corruption objective of Sections 3.3.4
and 3.7): C4 (`c4/en`, Section 2.2), 2^19 = 524,288 steps of 128 sequences x 512 input tokens
(targets 114: T5's random_spans_helper for noise density 0.15 and mean span 3), Adafactor with the
inverse square root schedule 1/sqrt(max(n, 10^4)) (Section 3.1.2). Dropout: the paper pretrains with 0.1
(Section 3.1.2); T5 1.1 turned it off in pretraining as a quality win (released_checkpoints.md) and every
recipe here, 1.0 included, pretrains without it, so the default command runs a fused attention kernel on a
GPU or TPU (attention-probability dropout has none); `--config.model.dropout_rate=0.1` is the paper's 1.0
baseline, on the einsum path. Fine-tuning turns it back on (configs/glue.py). `released` is the recipe of the
released 1.0 checkpoints (Section 3.7): batch 2^11 = 2048, 10^6 steps (~1T tokens). Cross-entropy
with t5x's z-loss 1e-4. `short` trains the tiny model on the demo corpus in minutes on a CPU.
"""
import ml_collections

from configs import common

SIZES = {  # version -> size -> (layers per stack, d_model, heads, d_ff, d_kv)
    "1.0": {
        "tiny": (2, 128, 4, 512, 32),
        "small": (6, 512, 8, 2048, 64),
        "base": (12, 768, 12, 3072, 64),
        "large": (24, 1024, 16, 4096, 64),
        "3b": (24, 1024, 32, 16384, 128),
        "11b": (24, 1024, 128, 65536, 128),
    },
    "1.1": {
        "tiny": (2, 128, 4, 320, 32),
        "small": (8, 512, 6, 1024, 64),
        "base": (12, 768, 12, 2048, 64),
        "large": (24, 1024, 16, 2816, 64),
        "xl": (24, 2048, 32, 5120, 64),
        "xxl": (24, 4096, 64, 10240, 64),
    },
}
ALIASES = {"1.1": {"3b": "xl", "11b": "xxl"}}
SMALL_SIZES = ("tiny",)  # these default to the short recipe on the demo corpus

RECIPES = {  # flattened overrides of the fields below
    "paper": {},  # the defaults below are the paper's baseline
    "released": {"batch_size": 2048, "num_train_steps": 1_000_000},  # Raffel et al. (2020), Section 3.7
    "short": {  # a few minutes on a laptop CPU with the demo corpus of `make demo`
        # T5's Adafactor step 0.01, flat for 100 steps then 1/sqrt decay (0.1 / sqrt(max(n, 100))): eval
        # cross-entropy 5.17 after 200 steps; 1.0 / sqrt(max(n, 100)) (peak 0.1) stalls at 5.7
        "batch_size": 32, "num_train_steps": 600, "optimizer.learning_rate": 0.1, "optimizer.warmup_steps": 100,
        "log_every": 10, "checkpoint_every": 200, "eval_every": 200,
        "data.source": "text", "data.path": "demo_out/corpus.txt", "data.tfds_name": "", "data.eval_documents": 20,
        "data.max_seq_length": 128, "tokenizer.path": "demo_out/tokenizer/spm.model", "tokenizer.lowercase": True,
        "model.vocab_size": 8192,  # 8000 pieces + 100 sentinels, rounded up to a multiple of 128 as T5's 32128
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="base", version="1.0", recipe="")
    if arg.version not in SIZES:
        raise ValueError(f"configs/t5.py: version={arg.version!r} is not one of {list(SIZES)}")
    size = ALIASES.get(arg.version, {}).get(arg.size, arg.size)
    if size not in SIZES[arg.version]:
        names = list(SIZES[arg.version]) + list(ALIASES.get(arg.version, {}))
        raise ValueError(f"configs/t5.py: size={arg.size!r} is not one of {names} for version={arg.version}")
    recipe = arg.recipe or ("short" if size in SMALL_SIZES else "paper")
    if recipe not in RECIPES:
        raise ValueError(f"configs/t5.py: recipe={recipe!r} must be one of {list(RECIPES)}")
    layers, d_model, heads, d_ff, d_kv = SIZES[arg.version][size]
    v1_1 = arg.version == "1.1"

    c = common.trainer_config()
    c.batch_size = 128               # Section 3.1.2: 128 sequences of 512 tokens (2^16 tokens per batch)
    c.num_train_steps = 2 ** 19      # Section 3.1.2: 524,288 steps (~34B tokens)
    c.log_every = 100
    c.checkpoint_every = 10_000
    c.eval_every = 10_000

    c.model = ml_collections.ConfigDict(dict(
        name="t5", vocab_size=32128, d_model=d_model, num_heads=heads, head_dim=d_kv, d_ff=d_ff,
        num_encoder_layers=layers, num_decoder_layers=layers,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        dropout_rate=0.0, layer_norm_eps=1e-6,
        feed_forward="gated-gelu" if v1_1 else "relu", tie_word_embeddings=not v1_1,
        initializer_factor=1.0, dtype="float32", param_dtype="float32",
        **common.compute_fields()))

    # Adafactor (Shazeer & Stern 2018) as T5/t5x: factored second moments, decay 1 - t^-0.8, update
    # clipping at RMS 1, steps relative to the weights' RMS, no momentum. pretrain/training/optimizers.py's rsqrt
    # schedule is learning_rate / sqrt(max(step, warmup_steps)): 1.0 and 10^4 give 0.01 for 10^4 steps.
    c.optimizer = ml_collections.ConfigDict(dict(
        name="adafactor", learning_rate=1.0, schedule="rsqrt", warmup_steps=10_000, decay_rate=0.8,
        clipping_threshold=1.0, multiply_by_parameter_scale=True, weight_decay=0.0, grad_clip_norm=0.0))

    c.objective = ml_collections.ConfigDict(dict(
        name="span_corruption",
        mode="span_corruption",      # span_corruption | prefix_lm | iid_denoising | bert_style (Section 3.3)
        noise_density=0.15, mean_noise_span_length=3.0,  # Section 3.3.4, Table 7
        corruption="replace_spans",  # iid_denoising only: Section 3.3.2, Table 5
        targets_length=0,            # decoder length; 0 = derived: 114 for 512 inputs, 29 for 128
        z_loss=1e-4))                # t5x's default auxiliary loss on log Z

    c.data = ml_collections.ConfigDict(dict(
        **common.corpus_fields(source="tfds", tfds_name="c4/en"),
        max_seq_length=512,          # encoder input length (Section 3.1.2)
        **common.input_pipeline_fields()))

    # T5's SentencePiece model is cased (32,000 pieces) with 100 sentinels <extra_id_k> at the end.
    c.tokenizer = ml_collections.ConfigDict(dict(kind="sentencepiece", path="", lowercase=False, extra_ids=100))

    c.update_from_flattened_dict(RECIPES[recipe])
    c.lock()
    return c
