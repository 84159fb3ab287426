"""Pretraining in a wall-clock budget on a few CPU cores ("Cramming", Geiping & Goldstein 2022): one recipe per
architecture, every arm of the sweep that chose `make cram`'s default (docs/cram.md has the measurements).

  python -m scripts.reproduce.cram --minutes=60 --output=runs/cram              # the corpus, the tokenizer, recipe=best
  python -m pretrain.train --config=configs/cram.py:arch=modernbert,minutes=20 --workdir=runs/cram_sweep/x
  python -m pretrain.sweep --config=configs/cram.py --sweep=arch --workdir=runs/cram_sweep   # resumable
  python -m scripts.reproduce.cram_report --sweep=runs/cram_sweep                    # the table and the plot

The corpus and SentencePiece model are scripts/reproduce/cram.py's (runs/cram/corpus.txt and spm.model by default;
--config.data.path and --config.tokenizer.path for others). Every arm trains for `minutes` of this machine
(config.budget_minutes: the steps, the warm-up and the evaluations fitted to the budget, pretrain/loops/budget.py)
and is scored the same way: held-out MLM loss at 15% masking (objective.eval_mask_prob) on the same 50 held-out
documents, evaluated 40 times along the run (the loss-against-minutes curve).

Config string (each an axis of get_sweep, except recipe):
  recipe    base (the default: where the sweeps start, 2018's BERT recipe) | best (the sweeps' choice, BEST: make
            cram's and make demo's); the axes the string names override its recipe's
  arch      bert (2018's recipe: post-LN, biases, learned absolute positions, a GELU MLP) | bert_preln (the same with
            pre-LN blocks and a final LayerNorm) | modernbert (pre-norm, no biases, RoPE, GeGLU, local/global attention)
  size      LAYERSxWIDTH: 2x128, 4x256, 4x512 (heads of 64; BERT's MLP 4x the width, ModernBERT's GeGLU 1.5x, as
            its released sizes)
  seq       64 | 128 tokens per row (64: twice the rows, the same tokens per batch)
  mask      the training masking rate (0.15 BERT, 0.3 ModernBERT, 0.4 Wettig et al. 2023)
  schedule  linear (10% warm-up, linear decay) | onecycle (Cramming's triangle: up for half the steps, down for
            the other half) | wsd (ModernBERT's warmup-stable-decay: 10% up, the last 20% down as 1 - sqrt)
  clip      the global gradient-norm clipping (Cramming: 0.5)
  ramp      off | on: Cramming's batch-size ramp, here from 16 rows to 64 (4 groups of 16 averaged per update),
            growing linearly until 60% of the steps (optimizer.ramp_accumulation); off: 32 rows a step throughout
  minutes   the budget
  steps     > 0: exactly this many steps in place of the clock (the schedule stretched over them, as
            config.budget_steps replays a budget's plan): bitwise the same run on any machine, however slow
            (make demo's)
"""
import ml_collections

from configs import bert, common, modernbert
from configs.sweep_axes import chain, product, sweep

ARCHS = ("bert", "bert_preln", "modernbert")
SIZES = ("2x128", "4x256", "4x512")
SCHEDULES = {  # name: (schedule, warm-up share of the steps)
    "linear": ("warmup_linear_decay", 0.1),
    "onecycle": ("warmup_linear_decay", 0.5),
    "wsd": ("warmup_stable_decay", 0.1),
}
WSD_DECAY_FRACTION = 0.2   # of the steps after the warm-up (Hägele et al. 2024: 20% decay matches cosine)
NOMINAL_STEPS = 1000       # the schedule's shape; config.budget_minutes stretches it to the steps that fit
EVALUATIONS = 40           # held-out evaluations along a run
RAMP = dict(rows=16, accumulation=4)  # ramp=on: 16 rows a step, 16 -> 64 rows an update (optimizer.ramp_fraction 0.6)
# recipe=base: where the sweeps start (2018's BERT recipe: an arm names only what it changes, so that its command
# replays it whatever is chosen later); recipe=best: what the sweeps chose (docs/cram.md), make cram's and make demo's
BASE = dict(arch="bert", size="2x128", seq=128, mask=0.4, schedule="linear", clip=1.0, ramp="off", minutes=60.0,
            steps=0)
BEST = dict(BASE, arch="modernbert", mask=0.15, schedule="wsd")


def _family_config(arch: str, layers: int, width: int) -> ml_collections.ConfigDict:
    """The family's config at the short recipe, shaped layers x width."""
    if arch not in ARCHS:
        raise ValueError(f"configs/cram.py: arch={arch!r} is not one of {list(ARCHS)}")
    if arch == "modernbert":
        c = modernbert.get_config("size=tiny,recipe=short")
        ffn = width * 3 // 2
    else:
        c = bert.get_config("size=tiny,recipe=cram,nsp=False")
        c.model.pre_norm = arch == "bert_preln"
        ffn = 4 * width
    c.model.update(num_layers=layers, hidden_size=width, num_heads=max(1, width // 64), intermediate_size=ffn)
    return c


def _size(size: str) -> tuple[int, int]:
    layers, _, width = size.partition("x")
    if not (layers.isdigit() and width.isdigit()) or int(width) % 64 and int(width) > 64:
        raise ValueError(f"configs/cram.py: size={size!r} must be LAYERSxWIDTH with a width that heads of 64 divide "
                         f"(e.g. {', '.join(SIZES)})")
    return int(layers), int(width)


def _arms(arg: str | None) -> ml_collections.ConfigDict:
    """The config string -> every axis: those it names, the others from its recipe= (base or best)."""
    recipe = common.parse_arg(arg, recipe="base", **BASE).recipe
    if recipe not in ("base", "best"):
        raise ValueError(f"configs/cram.py: recipe={recipe!r} is not 'base' (2018's, where the sweeps start) or 'best'")
    return common.parse_arg(arg, recipe=recipe, **(BEST if recipe == "best" else BASE))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = _arms(arg)
    if arg.schedule not in SCHEDULES:
        raise ValueError(f"configs/cram.py: schedule={arg.schedule!r} is not one of {list(SCHEDULES)}")
    if arg.ramp not in ("off", "on"):
        raise ValueError(f"configs/cram.py: ramp={arg.ramp!r} is not 'off' or 'on'")
    c = _family_config(arg.arch, *_size(arg.size))
    with c.unlocked():
        schedule, warmup_share = SCHEDULES[arg.schedule]
        ramp = arg.ramp == "on"
        c.optimizer.update(schedule=schedule, learning_rate=1e-3, grad_clip_norm=arg.clip,
                           warmup_steps=round(warmup_share * NOMINAL_STEPS), decay_fraction=WSD_DECAY_FRACTION,
                           ramp_accumulation=RAMP["accumulation"] if ramp else 1)
        rows = RAMP["rows"] if ramp else 32
        c.update(batch_size=rows * 128 // arg.seq, num_train_steps=NOMINAL_STEPS,
                 budget_minutes=0.0 if arg.steps else arg.minutes, budget_steps=arg.steps,
                 log_every=20, eval_every=NOMINAL_STEPS // EVALUATIONS, eval_batches=8,
                 checkpoint_every=NOMINAL_STEPS // 4)
        c.model.update(vocab_size=8000, dropout_rate=0.0, attention_dropout_rate=0.0)
        if arg.arch == "modernbert":  # its 128-token window (64 either side) is local in a 128-token row; half as
            c.model.local_attention = min(128, arg.seq)  # long in a 64-token row (a wider one would be global)
        c.data.update(path="runs/cram/corpus.txt", max_seq_length=arg.seq, long_seq_length=0, eval_documents=50)
        c.tokenizer.update(kind="sentencepiece", path="runs/cram/spm.model")
        c.objective.update(mask_prob=arg.mask, max_predictions_per_seq=int(arg.mask * arg.seq) + 1,
                           eval_mask_prob=0.15)
    return c


def get_sweep(arg: str) -> list[dict]:
    """--sweep=NAME[:ARCH][@MINUTES] -> cells (configs/sweep_axes.py), each at MINUTES (default 20).
    arch: the three architectures at the default recipe (arch=bert is configs/bert.py's recipe=cram, 2018's model
    at 40% masking). recipe[:ARCH] (default modernbert): one change at a time from ARCH at the default recipe:
    size, masking rate, schedule, clipping, sequence length, batch ramp. best: recipe=best alone (the changes that
    won, together). long: the changes from recipe=best that a longer budget may favour (a model four times the
    size; 30% masking, a harder task per row), the 60-minute stage beside make cram's own recipe=best run."""
    spec, _, minutes = (arg or "arch").partition("@")
    name, _, arch = spec.partition(":")
    budget = sweep("arg.minutes", [float(minutes or 20)])
    if name == "arch":
        return product(sweep("arg.arch", list(ARCHS)), budget)
    if name == "recipe":
        one_change = chain(sweep("arg.size", ["4x256", "4x512"]), sweep("arg.mask", [0.15, 0.3]),
                           sweep("arg.schedule", ["onecycle", "wsd"]), sweep("arg.clip", [0.5]),
                           sweep("arg.seq", [64]), sweep("arg.ramp", ["on"]))
        return product(sweep("arg.arch", [arch or "modernbert"]), one_change, budget)
    if name == "best":
        return product(sweep("arg.recipe", ["best"]), budget)
    if name == "long":
        return product(sweep("arg.recipe", ["best"]), chain(sweep("arg.size", ["4x256"]), sweep("arg.mask", [0.3])),
                       budget)
    raise ValueError(f"configs/cram.py: --sweep={arg!r} is not arch[@MINUTES], recipe[:ARCH][@MINUTES], "
                     "best[@MINUTES] or long[@MINUTES]")
