"""Fine-tuning BERT (a task head) or T5 (text to text) on a GLUE task, with each paper's recipe.

  python -m pretrain.finetune --config=configs/glue.py:task=mrpc --workdir=runs/mrpc \
      --config.init=PATH [--config.optimizer.learning_rate=3e-5 --config.seed=1 ...]
  python -m pretrain.finetune --config=configs/glue.py:task=mrpc,model=t5 --workdir=runs/mrpc_t5 \
      --config.init=PATH
  python -m pretrain.finetune --config=configs/glue.py:task=sst2,model=gpt --workdir=runs/sst2_gpt \
      --config.init=PATH

PATH is a pretrain.train workdir (Orbax) or a Hugging Face directory (BERT: config.json +
model.safetensors / pytorch_model.bin + vocab.txt; ModernBERT: the same with tokenizer.json; T5: the same with
spiece.model; GPT-2: the same with vocab.json + merges.txt); the architecture and the tokenizer come from it.
`--config.init_weights=random` keeps them and starts from fresh weights (config.seed's initialization):
the random-init control of the same architecture.

Config string: `task=cola|sst2|mrpc|stsb|qqp|mnli|qnli|rte|wnli`, `model=bert|modernbert|t5|gpt`,
`freeze=none|head_only|lowest|gradual` (BERT and GPT; see pretrain/training/freezing.py), `size=` (T5 and GPT
without an init: the configs/t5.py or configs/gpt2.py size, default small), `peft=none|adapters|lora|prefix|prompt`.

ULMFiT's fine-tuning (Howard & Ruder 2018, Section 3.2-3.3) for few labels: `--config.optimizer.schedule=
slanted_triangular` (a short rise to the peak at cut_frac of the steps, a long fall to peak / ratio),
`--config.discriminative_factor=2.6` (each layer below the top at the rate of the one above / 2.6; the embeddings
one step further down), `freeze=gradual`; `--config.data.validation_examples=N` picks the best epoch on N training
examples held out (the same for every seed) and leaves dev as the test.

Parameter-efficient fine-tuning (`peft=`; models/peft/, pretrain/training/peft.py): only the
method's parameters and the task head train, and only they are stored, with a reference to the init.
Defaults follow the papers and peft; each method's learning rate replaces the full fine-tuning one
(PEFT needs larger ones):
  adapters  Houlsby et al. 2019: bottleneck 64 after attention and after the FFN, layer norms trained;
            learning rate 3e-4 (their grid: 3e-5, 3e-4, 3e-3), 20 epochs (their grid: 3, 20)
  lora      Hu et al. 2021: r 8, alpha 8 (peft's defaults), query and value; their RoBERTa-base GLUE
            schedule (Appendix D): 25-80 epochs and 4e-4 or 5e-4 per task, 6% warmup
  prefix    Li & Liang 2021: 20 key/value pairs per layer through a 512-wide MLP; learning rate 5e-3
  prompt    Lester et al. 2021: 20 embeddings initialized from sampled vocabulary entries; learning
            rate 3e-2 (they used 0.3 with Adafactor; with Adam, peft's examples use 3e-2)

T5 recipe (Raffel et al. 2020, Section 3.1.3): Adafactor with a constant learning rate of 0.001,
dropout 0.1, the task as "mrpc sentence1: ... sentence2: ..." -> "equivalent" (Appendix D). The
paper fine-tunes for 2^18 steps of 128 x 512 tokens; here the loop counts epochs (num_epochs) with
batch 32, which fits a CPU.

Recipe (Devlin et al., 2019, Section 4.1 and Appendix A.3): max sequence length 128, batch 32,
3 epochs, Adam with learning rate picked on dev from {5e-5, 4e-5, 3e-5, 2e-5}, 10% linear warmup
then linear decay, dropout 0.1, weight decay 0.01, the classifier on the pooled [CLS] vector.
`scripts/reproduce/reproduce_glue_table.py` sweeps the learning rates and seeds (get_sweep's `table`).

Sweeps (`python -m pretrain.sweep --config=configs/glue.py:task=mrpc --sweep=NAME --workdir=DIR
--config.init=PATH`; configs/sweep_axes.py): `lr_seed` the paper's four learning rates x seeds 0 1 2;
`table` every task of Table 1 x those learning rates x seeds (the config string's task is swept);
`lr_seed:LR,LR/SEED,SEED` (e.g. `lr_seed:2e-5,5e-5/0,1`) and `table:TASK,TASK` narrow them.

GPT recipe (Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training",
Section 4.1 "Fine-tuning details", and the defaults of its code, openai/finetune-transformer-lm
train.py): learning rate 6.25e-5, batch 32, 3 epochs, linear warmup over 0.2% of training then linear
decay, dropout 0.1 in the model and on the classifier's input, Adam b1 0.9 b2 0.999 eps 1e-8,
weight decay 0.01, gradient clipping 1.0; a linear head on the last token (pretrain/finetuners/gpt.py,
models/gpt_tasks.py). The paper also adds the LM loss with weight 0.5 (lambda); this loop does not.
max_seq_length 128 (at most the model's n_positions).
"""
import os

import ml_collections

from configs import common
from configs.sweep_axes import product, sweep


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, task="mrpc", model="bert", freeze="none", size="small", peft="none")
    if arg.model not in MODELS:
        raise ValueError(f"configs/glue.py: model={arg.model!r} must be one of {', '.join(map(repr, MODELS))}")
    c = common.trainer_config()
    c.task = arg.task
    # c.init (configs/common.py): the pretrain.train workdir or Hugging Face directory fine-tuning starts from
    c.init_weights = "pretrained"  # pretrained | random: the init's architecture and tokenizer with fresh weights
                                   # (the control row of a does-pretraining-help table)
    c.num_epochs = 3
    c.eval_every_epochs = 1        # dev evaluation (and the best epoch's checkpoint) every this many epochs, and after
                                   # the last: many short epochs (100 labels) would otherwise spend most time on dev
    c.batch_size = 32
    c.eval_batch_size = 64
    c.warmup_fraction = 0.1        # of all optimizer steps
    c.head_learning_rate = 0.0     # > 0: the fresh task head's peak learning rate (0: optimizer.learning_rate)
    c.discriminative_factor = 1.0  # ULMFiT's discriminative rates (pretrain/training/discriminative.py): layer i below
                                   # the top trains at the rate / factor^i, the embeddings one step lower; the top,
                                   # pooler and head at the rate (1 = off; ULMFiT: 2.6; not with peft)
    c.log_every = 50
    c.write_test_predictions = True
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = -1  # derived from warmup_fraction
    c.checkpoint_every = 0         # steps between resume checkpoints in DIR/resume (0 = only on preemption)
    c.skip_nonfinite_updates = False  # True: drop a NaN/inf update and count it; False: stop with one line
    del c["num_train_steps"], c["budget_minutes"], c["budget_steps"], c["keep_checkpoints"], c["eval_every"], c["eval_batches"]

    c.freezing = ml_collections.ConfigDict(dict(
        strategy=arg.freeze,
        num_frozen_layers=0,       # `lowest`: layers 0..N-1 stay frozen
        freeze_embeddings=True,    # `lowest`: the embeddings too
        unfreeze_every_epochs=1))  # `gradual`: one more layer every this many epochs

    c.peft = peft_config(arg.peft)
    # Task distillation (Hinton et al. 2015; pretrain/distillation/task_teacher.py): a finished fine-tuning workdir of
    # the same task teaches: loss = alpha * T^2 KL(teacher/T || student/T) + (1 - alpha) * CE(labels).
    c.distillation = ml_collections.ConfigDict(dict(teacher="", alpha=0.5, temperature=2.0))  # teacher '' = off

    # Architecture defaults = BERT-Base; with an init they are replaced by the checkpoint's.
    c.model = ml_collections.ConfigDict(dict(
        name="bert", vocab_size=30522, hidden_size=768, num_layers=12, num_heads=12,
        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
        dropout_rate=0.1, attention_dropout_rate=0.1, layer_norm_eps=1e-12, initializer_range=0.02,
        classifier_dropout=0.1, dtype="float32", param_dtype="float32",
        **common.compute_fields()))
    # Empty path: the init's tokenizer (a HF directory's vocab.txt, a workdir's tokenizer).
    c.tokenizer = ml_collections.ConfigDict(dict(kind="wordpiece", path="", lowercase=True))

    c.data = ml_collections.ConfigDict(dict(
        source="dir",              # dir: official GLUE layout under glue_dir | tfds: glue/<task> | hf: the Hub's
        glue_dir=os.environ.get("GLUE_DIR", "../shared/data/glue"),
        tfds_data_dir="",
        hf_path="nyu-mll/glue",    # hf: the Hub dataset (a config per task), or a local copy of its repository
        max_seq_length=128,
        max_train_examples=0,      # > 0: a fixed random subset of the train split (same for every seed)
        validation_examples=0,     # > 0: that many of the training examples (after max_train_examples) held out, the
                                   # same for every seed, to pick the best epoch on; dev is then only reported. They
                                   # are not trained on: max_train_examples=1000 with 100 here trains on 900 labels
        skip_malformed=False,      # drop TSV rows with the wrong number of fields (the original QQP has a few)
        pad_to_multiple_of=8,      # batches pad to the longest row rounded up to this,
        length_buckets=4))         # then to the next of 4 halvings of max_seq_length (128: 16 32 64 128),
                                   # so that at most 4 shapes compile (0: any multiple of pad_to_multiple_of)
    if arg.model == "t5":
        _text_to_text(c, arg.size)
    if arg.model == "gpt":
        _last_token_classifier(c, arg.size)
    if arg.model == "modernbert":
        _modernbert(c, arg.size)
    with c.optimizer.unlocked():   # schedule=slanted_triangular (ULMFiT); after T5's locked optimizer replaced BERT's
        c.optimizer.cut_frac = 0.1     # the share of the steps over which the rate rises to its peak
        c.optimizer.ratio = 32.0       # the peak rate / the rate at the first and last steps
    if arg.peft in PEFT_LEARNING_RATES:
        c.optimizer.learning_rate = PEFT_LEARNING_RATES[arg.peft]
    _peft_schedule(c, arg.peft, arg.task)
    c.lock()
    return c


MODELS = ("bert", "modernbert", "t5", "gpt")
PAPER_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)  # Devlin et al. 2019, Section 4.1: picked on dev per task
PAPER_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")  # Table 1's columns


def get_sweep(arg: str) -> list[dict]:
    """--sweep=NAME[:VALUES] -> cells (configs/sweep_axes.py). lr_seed[:LRS/SEEDS]: learning rate x seed;
    table[:TASKS]: task x the paper's learning rates x seeds 0 1 2, as Table 1 is reproduced."""
    name, _, values = (arg or "lr_seed").partition(":")
    if name == "lr_seed":
        rates, _, seeds = values.partition("/")
        return product(sweep("optimizer.learning_rate", [float(x) for x in rates.split(",")] if rates
                             else list(PAPER_LEARNING_RATES)),
                       sweep("seed", [int(x) for x in seeds.split(",")] if seeds else [0, 1, 2]))
    if name == "table":
        tasks = values.split(",") if values else list(PAPER_TASKS)
        return product(sweep("arg.task", tasks), sweep("optimizer.learning_rate", list(PAPER_LEARNING_RATES)),
                       sweep("seed", [0, 1, 2]))
    raise ValueError(f"configs/glue.py: --sweep={arg!r} is not lr_seed[:LRS/SEEDS] or table[:TASKS]")


PEFT_LEARNING_RATES = {"adapters": 3e-4, "lora": 5e-4, "prefix": 5e-3, "prompt": 3e-2}
# LoRA's GLUE schedule (Hu et al. 2021, Appendix D, Table 9, RoBERTa-base; their examples/NLU scripts):
# epochs per task, learning rate per task, warmup over 6% of the steps. Few trainable parameters need many
# more updates than full fine-tuning's 3 epochs: at 3 epochs LoRA stays at the majority class on CoLA and RTE.
LORA_EPOCHS = {"mnli": 30, "sst2": 60, "mrpc": 30, "cola": 80, "qnli": 25, "qqp": 25, "rte": 80, "stsb": 40}
LORA_LEARNING_RATES = {"mnli": 5e-4, "sst2": 5e-4, "mrpc": 4e-4, "cola": 4e-4, "qnli": 4e-4, "qqp": 5e-4,
                       "rte": 5e-4, "stsb": 4e-4}
LORA_WARMUP_FRACTION = 0.06
# Adapters (Houlsby et al. 2019, Section 3.1): 3 or 20 epochs picked on dev; the longer one by default.
ADAPTER_EPOCHS = 20


def _peft_schedule(c: ml_collections.ConfigDict, method: str, task: str) -> None:
    """The method's published schedule where it has one for GLUE (prefix- and prompt-tuning's papers train
    other benchmarks: those keep the fine-tuning schedule)."""
    if method == "lora":
        c.num_epochs = LORA_EPOCHS.get(task, c.num_epochs)  # WNLI is not in their table: 3 epochs
        c.optimizer.learning_rate = LORA_LEARNING_RATES.get(task, c.optimizer.learning_rate)
        c.warmup_fraction = LORA_WARMUP_FRACTION
    elif method == "adapters":
        c.num_epochs = ADAPTER_EPOCHS


def peft_config(method: str) -> ml_collections.ConfigDict:
    """config.peft: the method and every knob of each (models/peft/), whichever is chosen."""
    return ml_collections.ConfigDict(dict(
        method=method,             # none | adapters | lora | prefix | prompt
        adapters=dict(size=64,     # the bottleneck width m
                      placement="houlsby",  # houlsby: after attention and the FFN | pfeiffer: after the FFN only
                      train_norms=True),    # Houlsby et al. train the layer norms too
        lora=dict(rank=8, alpha=8.0, dropout=0.0,
                  targets="query,value"),   # of query, key, value, out (attention), intermediate, output (FFN)
        prefix=dict(length=20,     # key/value pairs per layer
                    hidden_size=512),       # the reparameterization MLP's width (0: train the pairs directly)
        prompt=dict(length=20,     # virtual input embeddings
                    init="vocab")))         # vocab: copies of sampled vocabulary embeddings | random: N(0, 1)


def _text_to_text(c: ml_collections.ConfigDict, size: str) -> None:
    """T5's fine-tuning recipe in place of BERT's (Raffel et al. 2020, Section 3.1.3)."""
    from configs import t5
    pretraining = t5.get_config(f"size={size},recipe=paper")
    c.model = pretraining.model
    c.model.dropout_rate = 0.1
    c.optimizer = pretraining.optimizer
    c.optimizer.update(dict(schedule="constant", learning_rate=1e-3, warmup_steps=0))
    c.warmup_fraction = 0.0
    c.z_loss = pretraining.objective.z_loss
    c.tokenizer = pretraining.tokenizer
    c.data.max_seq_length = 512  # inputs; the targets are the longest label word + EOS


def _modernbert(c: ml_collections.ConfigDict, size: str) -> None:
    """ModernBERT (configs/modernbert.py) in place of BERT: its architecture (an init's replaces it), no dropout in
    the body and none on the classifier (Hugging Face's defaults), the head on the prediction head over [CLS]; BERT's
    schedule at 5e-5 (Warner et al. 2024 sweep the learning rate per task)."""
    from configs import modernbert
    c.model = ml_collections.ConfigDict({**modernbert.get_config(f"size={size}").model.to_dict(),
                                         "classifier_dropout": 0.0})
    c.optimizer.learning_rate = 5e-5
    c.tokenizer = ml_collections.ConfigDict(dict(kind="hf_json", path="", lowercase=False))  # an init brings its own


def _last_token_classifier(c: ml_collections.ConfigDict, size: str) -> None:
    """GPT-1's fine-tuning recipe in place of BERT's (Radford et al. 2018, Section 4.1)."""
    from configs import gpt2
    pretraining = gpt2.get_config(f"size={size}")
    # Dropout 0.1: embd/resid/attn_pdrop, and clf_pdrop on the head (HF's GPT2ForSequenceClassification: 0).
    c.model = ml_collections.ConfigDict({**pretraining.model.to_dict(), "dropout_rate": 0.1,
                                         "attention_dropout_rate": 0.1, "classifier_dropout": 0.1})
    c.optimizer.update(dict(name="adamw", learning_rate=6.25e-5, schedule="warmup_linear_decay", end_learning_rate=0.0,
                            b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, grad_clip_norm=1.0))
    c.warmup_fraction = 0.002
    c.tokenizer = pretraining.tokenizer  # GPT-2's byte-level BPE; an init brings its own
    c.data.max_seq_length = min(c.data.max_seq_length, c.model.n_positions)
