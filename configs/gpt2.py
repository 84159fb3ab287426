"""GPT-2 causal-LM pretraining at the four released sizes, and nanoGPT's character-level Shakespeare.

Launch:
  python -m pretrain.train --config=configs/gpt2.py:size=nano_shakespeare_char_cpu --workdir=runs/shakespeare
  python -m pretrain.train --config=configs/gpt2.py:size=small --workdir=/gcs/bucket/gpt2_small \
      --config.data.path='owt/*.txt' --config.tokenizer.path=gpt2/

Config string: `size=small|medium|large|xl|nano_shakespeare_char|nano_shakespeare_char_cpu|tiny`.

Sizes (layers / d_model / heads): Radford et al. (2019), "Language Models are Unsupervised Multitask
Learners", Table 2 and Section 2.3 (vocabulary 50,257, context 1024, d_ff = 4 * d_model), as in the
released checkpoints. Exact parameter counts of our GPT (models/gpt.py, output tied to the token
embedding), equal to Hugging Face's GPT2LMHeadModel for the same config (tests/models/test_gpt2_configs.py):
  small  12 / 768 / 12     124,439,808   medium 24 / 1024 / 16   354,823,168
  large  36 / 1280 / 20    774,030,080   xl     48 / 1600 / 25 1,557,611,200
Table 2 of the paper says 117M / 345M / 762M / 1542M; those figures are known to be miscounted: the
released checkpoints hold the numbers above (nanoGPT's README: 124M / 350M / 774M / 1558M).

Recipe for the GPT-2 sizes: nanoGPT's config/train_gpt2.py, which reproduces GPT-2 (124M) on
OpenWebText (val loss ~2.85 after 600k steps, nanoGPT README): 480 sequences of 1024 tokens per step
(12 x 5 x 8 GPUs, ~0.5M tokens), 600,000 steps (~300B tokens), AdamW lr 6e-4, b1 0.9, b2 0.95, eps 1e-8
(torch's default), weight decay 0.1 on matrices and embeddings only, global-norm clipping 1.0, 2,000
warmup steps, cosine decay to min_lr 6e-5, dropout 0 (nanoGPT: "for pretraining 0 is good"). OpenWebText is
not in TFDS: give its text files (one document per blank-line-separated block) in data.path.

`nano_shakespeare_char`: nanoGPT's config/train_shakespeare_char.py: 6 layers, 6 heads, d_model 384,
block 256, dropout 0.2, batch 64, lr 1e-3, 5,000 steps decaying over lr_decay_iters 5,000 to min_lr
1e-4, b2 0.99, 100 warmup steps, eval every 250 steps on 200 batches; best val loss 1.4697 on one A100
(nanoGPT README). `nano_shakespeare_char_cpu`: the README's CPU command (--block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0 --eval_iters=20 --log_interval=1): val loss 1.88 in about 3 minutes. Both read the
1,115,394-character tinyshakespeare corpus verbatim (newlines included, data.source='raw_text') with
a character tokenizer of its 65 characters (nanoGPT's data/shakespeare_char/prepare.py: vocab size
65) and nanoGPT's split: the first 90% of the characters train, the last 10% evaluate.
Parameter counts: 10,770,816 and 809,856; nanoGPT prints 10.65M and 0.80M because it leaves out the
position embeddings and trains with bias=False (no biases in the linear layers and LayerNorms).

`tiny` (2 layers, width 128, 2 heads, context 128; 1,437,184 parameters): the demo assets of `make
demo` (its CPython-docs corpus, 20 documents held out, and 8,000-piece SentencePiece model; [SEP] ends
documents), batch 32, 600 steps, dropout 0.1, AdamW 1e-3 with the shakespeare schedule: the GPT
counterpart of configs/bert.py and configs/t5.py's tiny sizes, for fine-tuning and few-shot runs on
GLUE (`make demo-gpt-glue`).

Known differences from nanoGPT: batches are windows of block_size + 1 characters on a grid that
starts every block_size characters from a random offset per data epoch, shuffled (nanoGPT draws
every window's start at random); the shakespeare models keep GPT-2's biases, as GPT2LMHeadModel, the
benchmark's reference (--config.model.use_bias=false gives nanoGPT's bias=False model: 804,096
parameters for the CPU size). Measured results of these configs are in docs/finetuning.md (GPT section).
"""
import ml_collections

from configs import common

SIZES = {  # name: (layers, d_model, heads, n_positions, vocab)
    "small": (12, 768, 12, 1024, 50257),
    "medium": (24, 1024, 16, 1024, 50257),
    "large": (36, 1280, 20, 1024, 50257),
    "xl": (48, 1600, 25, 1024, 50257),
    "nano_shakespeare_char": (6, 384, 6, 256, 65),
    "nano_shakespeare_char_cpu": (4, 128, 4, 64, 65),
    "tiny": (2, 128, 2, 128, 8000),  # the demo assets of `make demo` (BERT's and T5's tiny sizes)
}
SHAKESPEARE = "../shared/data/tinyshakespeare/input.txt"  # beside the repository (see DESIGN.md)

RECIPES = {  # size -> flattened overrides of the GPT-2 recipe below
    "nano_shakespeare_char": {  # nanoGPT config/train_shakespeare_char.py
        "batch_size": 64, "num_train_steps": 5000, "log_every": 10, "eval_every": 250, "eval_batches": 200,
        "checkpoint_every": 250,
        "optimizer.learning_rate": 1e-3, "optimizer.end_learning_rate": 1e-4, "optimizer.warmup_steps": 100,
        "optimizer.b2": 0.99, "model.dropout_rate": 0.2, "model.attention_dropout_rate": 0.2,
        "data.source": "raw_text", "data.path": SHAKESPEARE, "data.eval_fraction": 0.1,
        "tokenizer.kind": "char", "tokenizer.path": SHAKESPEARE,
    },
}
RECIPES["tiny"] = {  # minutes on a laptop CPU with the corpus and SentencePiece model of `make demo`
    # held-out loss plateaus by step 600-800 (5.30 at 600, 5.27 at 800, 5.31 at 1,200: the corpus is small)
    "batch_size": 32, "num_train_steps": 600, "log_every": 10, "eval_every": 200, "eval_batches": 4,
    "checkpoint_every": 200, "model.dropout_rate": 0.1, "model.attention_dropout_rate": 0.1,
    "optimizer.learning_rate": 1e-3, "optimizer.end_learning_rate": 1e-4, "optimizer.warmup_steps": 100,
    "optimizer.b2": 0.99,
    "data.source": "text", "data.path": "demo_out/corpus.txt", "data.eval_documents": 20,
    "tokenizer.kind": "sentencepiece", "tokenizer.path": "demo_out/tokenizer/spm.model", "tokenizer.lowercase": True,
}
RECIPES["nano_shakespeare_char_cpu"] = {  # nanoGPT README, "I only have a macbook"
    **RECIPES["nano_shakespeare_char"],
    "batch_size": 12, "num_train_steps": 2000, "log_every": 1, "eval_batches": 20,
    "model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="small")
    if arg.size not in SIZES:
        raise ValueError(f"configs/gpt2.py: size={arg.size!r} is not one of {list(SIZES)}")
    layers, d_model, heads, n_positions, vocab = SIZES[arg.size]

    c = common.trainer_config()
    c.batch_size = 480               # nanoGPT train_gpt2.py: 12 x 5 x 8 sequences of 1024 tokens
    c.num_train_steps = 600_000      # ~300B tokens
    c.log_every = 10
    c.checkpoint_every = 1000
    c.eval_every = 1000              # nanoGPT: eval_interval 1000, eval_iters 200
    c.eval_batches = 200

    c.model = ml_collections.ConfigDict(dict(
        name="gpt", vocab_size=vocab, n_positions=n_positions, d_model=d_model, num_layers=layers,
        num_heads=heads, d_ff=4 * d_model, dropout_rate=0.0, attention_dropout_rate=0.0,
        layer_norm_eps=1e-5, initializer_range=0.02, use_bias=True, dtype="float32", param_dtype="float32",
        **common.compute_fields()))

    c.optimizer.update(dict(
        name="adamw", learning_rate=6e-4, end_learning_rate=6e-5, schedule="warmup_cosine_decay",
        warmup_steps=2000, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip_norm=1.0))

    # objectives/causal_lm.py: documents joined into one stream cut into windows, as nanoGPT and GPT-2 train;
    # no auxiliary z-loss (nanoGPT has none)
    c.objective = ml_collections.ConfigDict(dict(name="causal_lm", pack_documents=True, z_loss=0.0))

    c.data = ml_collections.ConfigDict(dict(
        **common.corpus_fields(),    # and source=raw_text: the files verbatim as one stream (nanoGPT)
        eval_fraction=0.0,           # raw_text: the stream's last fraction held out (nanoGPT: 0.1)
        max_seq_length=n_positions,  # nanoGPT's block_size: the model's context
        **common.input_pipeline_fields()))

    # GPT-2's byte-level BPE (vocab.json + merges.txt); the shakespeare sizes use one id per character.
    c.tokenizer = ml_collections.ConfigDict(dict(kind="gpt2_bpe", path="", lowercase=False))

    c.update_from_flattened_dict(RECIPES.get(arg.size, {}))
    c.lock()
    return c
