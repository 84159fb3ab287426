"""Domain adaptation: a pretrained checkpoint's own self-supervised objective continued on a task's unlabelled text
(ULMFiT's second stage, Howard & Ruder 2018; task-adaptive pretraining, Gururangan et al. 2020), as one command
(pretrain/adapt.py). It is an ordinary pretraining run: the loop (pretrain/loops/pretraining.py) starts it from the
init's weights (config.init) and resumes it from its own checkpoints, and the fine-tuner takes its workdir as
--config.init.

    config = base_config(init, steps, family_config)     # the init's recipe, adapted (below); then --config.x=y
    report = adapt(config, workdir, Text(task="sst2", glue_dir=...), overridden)   # -> DIR/adaptation.json

The config: an init of ours brings its own config.json (objective, model, tokenizer, batch, data pipeline); a
Hugging Face directory its family's config file (`family_config`) with the checkpoint's architecture and tokenizer.
Then, for a short continuation: `steps` steps, 10% of them warm-up and a linear decay to 0 (ULMFiT's slanted
triangular rates: a short rise, a long fall), the peak at half the init recipe's peak (below), batches of at most
256 sequences (TAPT's batch), one sequence length, no budget. A held-out part of the task's text measures the
adaptation (its loss at step 0, the init's, and at the end); the init's own corpus's held-out text, where it can be
read, measures what the adaptation forgets.

The learning rate: half the peak of the recipe that pretrained the init. The warm-up of a continued run starts from
the init's trained weights, not a fresh Adam state on random ones, and a short run on a small text overfits fast;
Gururangan et al.'s TAPT continues RoBERTa (peak 6e-4) at 1e-4, their DAPT at 5e-4: half the peak sits between.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Collection

import jax.numpy as jnp
import ml_collections
import numpy as np

import models
from models.registry import Registry
from pretrain.data import documents, sources, tokenizers
from pretrain.loops import pretraining
from pretrain.runtime import distributed
from pretrain.runtime.errors import UserError
from pretrain.tasks import task_text
from pretrain.training import optimizers, pretrained, validation
from pretrain.workdir import storage
from pretrain.workdir import run_files as workdirs

STEPS = 500
WARMUP_FRACTION = 0.1
PEAK_FRACTION = 0.5    # of the init recipe's peak learning rate (the module docstring says why)
MAX_BATCH = 256        # sequences per step (TAPT's batch, Gururangan et al. 2020, Table 13)
EVALUATIONS = 5        # held-out evaluations (and checkpoints) over the run, besides step 0
HELD_OUT_FRACTION = 0.1
TEXT_FILE = "adaptation_text.txt"
REPORT_FILE = "adaptation.json"
GENERAL = "eval_general"  # metric prefix of the init's own held-out text
ROW_SPECIALS = 3       # [CLS] A [SEP] B [SEP]: tokens of a row that no text fills
# A Hugging Face init's recipe: its family's config file at the published checkpoints' recipe (the entry point loads
# it; pretrain/ imports nothing of configs/). BERT without NSP: a task's examples grouped into documents are not
# consecutive sentences, and continued pretraining is the masked LM alone (Gururangan et al. 2020).
FAMILY_CONFIGS: Registry[str] = Registry("adaptation recipe", key="model family", error=UserError)
FAMILY_CONFIGS.register("bert", "configs/bert.py:size=base,nsp=False")
FAMILY_CONFIGS.register("modernbert", "configs/modernbert.py:size=base")
FAMILY_CONFIGS.register("gpt", "configs/gpt2.py:size=small")
FAMILY_CONFIGS.register("t5", "configs/t5.py:size=small")


@dataclasses.dataclass(frozen=True)
class Text:
    """What the run reads: a GLUE task's training text (`task`, from `glue_dir`), a text file (`text`), or neither
    (the config's own data.* settings: a prepared or Hub corpus)."""
    task: str = ""
    glue_dir: str = ""
    labelled_only: int = 0
    text: str = ""


# ---------------------------------------------------------------------------------------------
# The config.
# ---------------------------------------------------------------------------------------------
def base_config(init: str, steps: int, family_config: Callable[[str], ml_collections.ConfigDict]
                ) -> ml_collections.ConfigDict:
    """The pretraining config of an adaptation of `init` (a pretrain.train workdir or a Hugging Face directory) for
    `steps` steps, unlocked; `family_config(family)`: a family's config file, for a Hugging Face init."""
    if steps < 1:
        raise UserError(f"--steps={steps}: give a positive number of steps")
    path = storage.absolute(os.path.expanduser(init)) if init else init
    stored = init_config(path)
    if stored is not None:
        config = ml_collections.ConfigDict(_tuples(stored))
    else:
        config = _hugging_face_config(init, family_config)
    config.unlock()
    config.init = path  # (a workdir of a version before the key gains it)
    _continue_for(config, steps)
    return config


def _hugging_face_config(init: str, family_config: Callable[[str], ml_collections.ConfigDict]
                         ) -> ml_collections.ConfigDict:
    """The family's config with the checkpoint's architecture and tokenizer, its rows within the model's positions
    (a ModernBERT recipe's 1,024 tokens, a checkpoint of 512 positions)."""
    checkpoint = pretrained.load_pretrained(init, "--init")  # a Hugging Face directory (or one line)
    if checkpoint.family not in FAMILY_CONFIGS:
        raise UserError(f"--init={init} holds a {checkpoint.family} model, which pretrain.adapt does not continue "
                        f"(families: {', '.join(FAMILY_CONFIGS)})")
    config = family_config(checkpoint.family)
    config.unlock()
    config.model.update(checkpoint.model)
    config.tokenizer.update(checkpoint.tokenizer)
    positions = models.family(config.model.name).positions_key
    if positions and config.model.get(positions):
        config.data.max_seq_length = min(config.data.max_seq_length, config.model[positions])
    return config


def init_config(path: str) -> dict | None:
    """config.json of the pretrain.train workdir `path` (or its checkpoints/ folder or a step folder), None for
    anything else (a Hugging Face directory: its config.json names a model_type)."""
    for workdir in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        stored = workdirs.stored_config(workdir) if workdir else None
        if stored and "model" in stored and storage.isdir(os.path.join(workdir, "checkpoints")):
            return stored
    return None


def _tuples(tree):
    """config.json's lists as the tuples the config files hold (mesh_shape): --config.x overrides parse them."""
    if isinstance(tree, dict):
        return {k: _tuples(v) for k, v in tree.items()}
    return tuple(tree) if isinstance(tree, list) else tree


def _continue_for(config: ml_collections.ConfigDict, steps: int) -> None:
    """The recipe of a short continuation (module docstring) in place of the init's pretraining schedule."""
    optimizer = config.optimizer
    optimizer.learning_rate = PEAK_FRACTION * float(f"{peak_learning_rate(optimizer, config.num_train_steps):.6g}")
    optimizer.schedule, optimizer.end_learning_rate = "warmup_linear_decay", 0.0
    optimizer.warmup_steps = max(1, round(WARMUP_FRACTION * steps))
    config.num_train_steps = steps
    config.eval_every = config.checkpoint_every = max(1, steps // EVALUATIONS)
    config.batch_size = min(config.batch_size, MAX_BATCH)
    config.grad_accum_steps = math.gcd(config.batch_size, config.get("grad_accum_steps", 1))
    # a budget, a batch-size ramp, a second sequence length, a profile: the init's run, not this one's
    for key, value in (("budget_minutes", 0.0), ("budget_steps", 0), ("profile_steps", ""),
                       ("optimizer.ramp_accumulation", 1), ("data.long_seq_length", 0),
                       ("data.long_seq_start_step", 0)):
        *parents, last = key.split(".")
        node = config
        for name in parents:
            node = node[name]
        if last in node:
            node[last] = value


def peak_learning_rate(optimizer: ml_collections.ConfigDict, steps: int) -> float:
    """The highest rate `optimizer`'s schedule reaches over `steps` steps (T5's rsqrt: learning_rate /
    sqrt(warmup_steps))."""
    schedule = optimizers.learning_rate_schedule(optimizer, steps)
    grid = np.unique(np.append(np.linspace(0, steps, 1025).round(), optimizer.get("warmup_steps", 0)))
    return float(np.max(np.asarray(schedule(jnp.asarray(grid, jnp.float32)))))


# ---------------------------------------------------------------------------------------------
# The text.
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Corpus:
    path: str                 # the text file the run reads
    documents: int
    text: str | None = None   # the task's text, to write to `path`
    examples: int = 0


def _task_corpus(config, source: Text, workdir: str) -> _Corpus:
    """The task's training text as documents of about one row (task_text.group_documents), counted in the
    tokenizer's tokens."""
    examples = task_text.training_examples(source.task, source.glue_dir, source.labelled_only)
    tokenizer = tokenizers.from_config(config.tokenizer)
    counts = iter(len(ids) for ids in tokenizer.encode_batch([line for e in examples for line in e]))
    tokens = [sum(next(counts) for _ in e) for e in examples]
    grouped = task_text.group_documents(examples, tokens, config.data.max_seq_length - ROW_SPECIALS)
    return _Corpus(os.path.join(workdir, TEXT_FILE), len(grouped), task_text.corpus_text(grouped), len(examples))


def _set_text(config, source: Text, workdir: str, overridden: Collection[str]) -> _Corpus | None:
    """config.data reads the task's text or the text file (None: the config's own data.* settings), the last
    documents held out unless --config.data.eval_documents says how many."""
    if not (source.task or source.text):
        if not any(key.startswith("data.") for key in overridden):
            raise UserError("no text to adapt on: give --task=NAME (a GLUE task's training text), --text=FILE or "
                            "--config.data.* (a prepared or Hugging Face Hub corpus)")
        return None
    if source.task and source.text:
        raise UserError(f"--task={source.task} and --text={source.text}: give one of them")
    if source.labelled_only and not source.task:
        raise UserError("--labelled_only picks a GLUE task's training examples: give it with --task")
    clash = sorted(k for k in overridden if k in ("data.source", "data.path", "data.hf_path"))
    if clash:
        raise UserError(f"--config.{clash[0]} and --task/--text both name the text: give one of them")
    if source.task:
        if storage.is_url(workdir):
            raise UserError(f"--task writes its text into --workdir={workdir}, and the text source reads local files: "
                            "give a local --workdir, or write the text yourself and pass --config.data.* (a prepared "
                            "corpus in a bucket)")
        corpus = _task_corpus(config, source, workdir)
    else:
        task_text.check_training_text(source.text)
        corpus = _Corpus(source.text, len(sources.read_text_corpus(source.text, "--text")))
    config.data.source, config.data.path, config.data.max_documents = "text", corpus.path, 0
    if "data.eval_documents" not in overridden:
        config.data.eval_documents = held_out_documents(corpus.documents, config.eval_batches * config.batch_size)
    return corpus


def held_out_documents(count: int, rows: int) -> int:
    """Documents to hold out of `count`: a tenth, at most the `rows` the evaluation reads (a document is about a
    row), none where fewer than 3 would leave too little to train on."""
    return 0 if count < 3 else min(rows, max(1, int(HELD_OUT_FRACTION * count)))


def _write_text(corpus: _Corpus, workdir: str) -> None:
    """The task's text into the workdir, by every process (each host may have a disk of its own; the text is the
    same); a workdir whose run adapted on other text is refused (same path, other data: resuming would go on with
    new text as if nothing changed)."""
    if corpus.text is None:
        return
    if (workdirs.stored_config(workdir) is not None  # a run started here
            and storage.exists(corpus.path) and storage.read_text(corpus.path) != corpus.text):
        raise UserError(f"{workdir} holds an adaptation on other text ({corpus.path} differs): resume it with its "
                        "own --task/--labelled_only, or use a new --workdir")
    storage.write_atomic(corpus.path, corpus.text)


def general_held_out(config: ml_collections.ConfigDict) -> tuple[list | None, str | None]:
    """(tokenized held-out documents of the init's own corpus, None) or (None, why there are none)."""
    stored = init_config(config.init)
    if stored is None:
        return None, "a Hugging Face init names no corpus of its own"
    data = ml_collections.ConfigDict(stored["data"])
    tokenizer = tokenizers.from_config(config.tokenizer)
    try:
        if data.source == "text" and data.get("eval_documents", 0):  # only the held-out documents tokenized
            held_out = sources.read_text_corpus(data.path)[:data.get("max_documents", 0) or None]
            held_out = sources.tokenize_documents(held_out[-data.eval_documents:], tokenizer)
        else:
            held_out = documents.load_documents(data, tokenizer)[1]
    except (UserError, OSError) as e:
        return None, f"the init's corpus could not be read ({str(e).splitlines()[0] if str(e) else e})"
    if not len(held_out):
        return None, "the init's config holds no text out (its data.eval_documents is 0)"
    return held_out, None


# ---------------------------------------------------------------------------------------------
# The run and its report.
# ---------------------------------------------------------------------------------------------
def adapt(config: ml_collections.ConfigDict, workdir: str, source: Text, overridden: Collection[str] = (),
          deadline: float | None = None) -> dict:
    """Writes the text, runs (or resumes) the continued pretraining of `config` (base_config's, with the flags'
    overrides: `overridden` names the keys they set) and writes DIR/adaptation.json, which it returns."""
    corpus = _set_text(config, source, workdir, overridden)
    validation.validate(config)  # before anything is written
    workdir = workdirs.prepare(workdir)
    if corpus is not None:
        _write_text(corpus, workdir)
    general, note = general_held_out(config)
    pretraining.train_and_evaluate(config, workdir, deadline, {GENERAL: general} if general is not None else None)
    losses = held_out_losses(workdir, config.num_train_steps, general is not None, note)
    report = _report(config, source, corpus) | losses
    if distributed.is_primary():
        workdirs.write_json_atomic(os.path.join(workdir, REPORT_FILE), report)
    return report


def _report(config, source: Text, corpus: _Corpus | None) -> dict:
    """adaptation.json's account of the run: the init, the text, the recipe."""
    text = storage.absolute(corpus.path) if corpus else config.data.get("path") or config.data.get("hf_path")
    return {"init": config.init, "task": source.task or None, "text": text,
            "examples": corpus.examples if corpus and source.task else None, "labelled_only": source.labelled_only,
            "documents": {"total": corpus.documents if corpus else None, "held_out": config.data.eval_documents},
            "steps": config.num_train_steps, "learning_rate": config.optimizer.learning_rate,
            "batch_size": config.batch_size, "max_seq_length": config.data.max_seq_length}


def held_out_losses(workdir: str, last_step: int, general: bool, note: str | None) -> dict:
    """{'task_text': {'before': metrics at step 0 (the init's weights), 'after': at `last_step`}, 'general_text':
    the same on the init's corpus, or {'skipped': why}}, from the run's metrics.jsonl (resumes included)."""
    found: dict[str, dict[int, dict]] = {"eval": {}, GENERAL: {}}
    for line in storage.read_text(os.path.join(workdir, "metrics.jsonl")).splitlines():
        record = json.loads(line) if line.strip() else {}
        prefix = GENERAL if any(k.startswith(GENERAL + "_") for k in record) else "eval"
        values = {k[len(prefix) + 1:]: v for k, v in record.items() if k.startswith(prefix + "_")}
        if values and record.get("step") in (0, last_step):
            found[prefix][record["step"]] = values
    out = {name: {"before": found[prefix].get(0), "after": found[prefix].get(last_step)}
           for name, prefix in (("task_text", "eval"), ("general_text", GENERAL))}
    if not found["eval"]:
        out["task_text"] = {"skipped": "no held-out task text (too few documents, or data.eval_documents=0)"}
    if not general:
        out["general_text"] = {"skipped": note}
    return out


def summary(report: dict) -> str:
    """One line: the held-out losses before -> after."""
    parts = []
    for name, title in (("task_text", "the task's text"), ("general_text", "the init's corpus")):
        losses = report[name]
        if "skipped" in losses:
            parts.append(f"on {title}: skipped ({losses['skipped']})")
        elif losses["before"] and losses["after"]:
            parts.append(f"on {title} {losses['before']['loss']:.4f} -> {losses['after']['loss']:.4f}")
    return "held-out loss " + "; ".join(parts)
