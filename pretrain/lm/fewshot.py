"""Few-shot prompting: in-context classification of GLUE tasks with a decoder-only language model.

--init is a pretrain.train GPT workdir or a Hugging Face GPT-2 directory (pretrain/lm/language_model.py).
Each dev example gets a prompt of an instruction naming the label set, k demonstrations drawn from
the train split, and the example (pretrain/tasks/glue/prompts.py has the format and the sampling and
context-overflow rules); the prediction is the label word whose completion " <word>" the model
scores highest. Score (Brown et al. 2020, GPT-3, Section 2.4): the sum of log P(completion tokens |
prompt), i.e. the log-probability of the whole word, by default; --normalize=true divides it by the
completion's token count (GPT-3's per-token likelihood, which it used on most tasks; it keeps long
words from losing to short ones merely for having more tokens to pay for).

Printed: the task's official metrics (pretrain/tasks/glue/metrics.py, as fine-tuning reports them) with
accuracy, the same for the majority-class baseline (the train split's most frequent class,
predicted for every evaluated example), how many demonstrations were dropped to fit the context,
and the first prompt in full. --output=DIR writes DIR/results.json and DIR/predictions.tsv.
--max_examples=n evaluates a fixed random subset of n dev examples: the same ones for every --seed,
--k and model, so runs compare.

A character-level model (tokenizer kind 'char') reads only the characters of the file its vocabulary
came from: prompts with others are a one-line error naming them. The Shakespeare recipe's vocabulary
lacks digits, braces and quotes, so such a model can only be evaluated if it was trained with
--config.tokenizer.path set to a text that also holds the GLUE text and the prompt template (the
training text itself can stay Shakespeare).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import numpy as np

from pretrain.lm.language_model import load_language_model, next_token_log_probs, pad_rows
from pretrain.runtime.errors import UserError
from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue import metrics as glue_metrics
from pretrain.tasks.glue import prompts
from pretrain.tasks.glue.data import Example, GlueTask

# (prompts: N token lists, completions: C token lists) -> [N, C] scores
Scorer = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], np.ndarray]
_SUBSET_SEED = 0  # --max_examples draws with a fixed seed: the same subset for every --seed and --k


def completion_scores(model, params, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                      *, pad_id: int, max_length: int, normalize: bool = False) -> np.ndarray:
    """[N, C]: log P(completion c | prompt n) summed over c's tokens (mean per token if `normalize`).

    One padded call scores every (prompt, completion) pair: row n * C + c is prompt n + completion c,
    and only the completion's positions are summed. `max_length` is the model's context; every row must
    fit it (prompts.fit_prompt sees to that).
    """

    rows = [list(p) + list(c) for p in prompt_ids for c in completion_ids]
    # Few shapes compile: lengths round up to 1/16 of the context (at most 16 lengths), never past it.
    ids, segment_ids = pad_rows(rows, pad_id, multiple=max(8, max_length // 16), max_length=max_length)
    log_probs = np.asarray(next_token_log_probs(model, params, ids, segment_ids))  # [R, L-1]
    # log_probs[r, t] = log P(ids[r, t + 1] | ids[r, :t + 1]): completion token j of row r sits at t = len(p) + j - 1
    starts = np.array([len(p) - 1 for p in prompt_ids for _ in completion_ids])
    lengths = np.array([len(c) for _ in prompt_ids for c in completion_ids])
    positions = np.arange(log_probs.shape[1])[None]
    in_completion = (positions >= starts[:, None]) & (positions < (starts + lengths)[:, None])
    scores = np.where(in_completion, log_probs, 0.0).sum(-1)
    if normalize:
        scores = scores / lengths
    return scores.reshape(len(prompt_ids), len(completion_ids))


def lm_scorer(lm, *, normalize: bool = False, batch_size: int = 8) -> Scorer:
    """A Scorer over a pretrain.lm.language_model.LanguageModel, `batch_size` prompts per model call (the last
    call padded to the same number of rows, so that one batch shape compiles)."""
    def score(prompt_ids, completion_ids):
        out = []
        for start in range(0, len(prompt_ids), batch_size):
            batch = list(prompt_ids[start:start + batch_size])
            real = len(batch)
            batch += [batch[0]] * (batch_size - real)
            out.append(completion_scores(lm.model, lm.params, batch, completion_ids, pad_id=lm.tokenizer.pad_id,
                                         max_length=lm.config.n_positions, normalize=normalize)[:real])
        return np.concatenate(out)
    return score


@dataclasses.dataclass
class FewShotResult:
    task: GlueTask
    fmt: prompts.PromptFormat
    examples: list[Example]
    prompts: list[prompts.FittedPrompt]
    scores: np.ndarray           # [N, C]
    predictions: np.ndarray      # [N] class ids
    labels: np.ndarray           # [N]
    metrics: dict[str, float]    # official metrics + accuracy
    majority_class: int          # the train split's most frequent class
    majority_metrics: dict[str, float]

    def summary(self) -> dict:
        dropped = np.array([p.num_dropped for p in self.prompts])
        truncated = np.array([p.num_truncated for p in self.prompts])
        return {
            "task": self.task.name, "num_examples": len(self.examples), "label_words": list(self.fmt.label_words),
            "metrics": self.metrics,
            "majority_baseline": {"label": self.fmt.label_words[self.majority_class], **self.majority_metrics},
            "prediction_counts": {w: int(np.sum(self.predictions == c)) for c, w in enumerate(self.fmt.label_words)},
            "mean_demonstrations": float(np.mean([p.num_demonstrations for p in self.prompts])),
            "mean_dropped_demonstrations": float(dropped.mean()),
            "truncated_prompts": int(np.sum(truncated > 0)),
            "mean_truncated_tokens": float(truncated.mean()),
        }


def _metrics(task: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    return {**glue_metrics.compute_metrics(task, predictions, labels),
            "accuracy": float(np.mean(predictions == labels))}


def evaluate_fewshot(task: GlueTask | str, examples: Sequence[Example], train: Sequence[Example], tokenizer,
                     scorer: Scorer, *, k: int, seed: int, max_length: int, balanced: bool = False,
                     label_words: Sequence[str] = (), split: str = "dev") -> FewShotResult:
    """Prompts every example with k demonstrations from `train`, scores the label words, computes metrics.

    `max_length` is the model's context in tokens; `split` only names the examples in error messages.
    """
    task = glue.get_task(task) if isinstance(task, str) else task
    fmt = prompts.prompt_format(task, label_words)
    if not examples:
        raise UserError(f"no {task.name} examples to evaluate")
    if any(int(e.label) < 0 for e in examples):
        raise UserError(f"{task.name} {split} has no labels (a test split): evaluate a dev split")
    sampler = prompts.DemonstrationSampler(train, k, seed=seed, num_labels=task.num_labels, balanced=balanced)

    def encode(text: str, where: str) -> list[int]:
        try:
            return tokenizer.encode(text)
        except UserError as e:  # a char vocabulary lacks a character: name the example too
            raise UserError(f"{where}: {e}") from None

    # the format's own text first: braces of its label set missing from a char vocabulary are no example's fault
    encode(prompts.template_text(fmt), f"the {task.name} prompt format (its instruction, label set "
                                       f"{{{', '.join(fmt.label_words)}}} and indicators, before any example)")
    completion_ids = [encode(c, f"{task.name} label word {c.strip()!r}") for c in prompts.completions(fmt)]
    budget = max_length - max(len(c) for c in completion_ids)
    fitted = []
    for example in examples:
        where = f"{task.name} {split} example {example.idx} (with its demonstrations, in the prompt)"
        fitted.append(prompts.fit_prompt(fmt, sampler.sample(example), example, lambda t: encode(t, where), budget))
    scores = np.asarray(scorer([p.ids for p in fitted], completion_ids), np.float64)
    predictions = scores.argmax(-1)
    labels = np.array([int(e.label) for e in examples])
    majority = int(np.bincount([int(e.label) for e in train], minlength=task.num_labels).argmax())
    return FewShotResult(task, fmt, list(examples), fitted, scores, predictions, labels,
                         _metrics(task, predictions, labels), majority,
                         _metrics(task, np.full_like(labels, majority), labels))


def subset(examples: Sequence[Example], max_examples: int) -> list[Example]:
    """A fixed random subset of `max_examples` (all if 0 or more than there are), in file order."""
    if max_examples < 0:
        raise UserError(f"--max_examples={max_examples} must be >= 0 (0 = all)")
    if not max_examples or max_examples >= len(examples):
        return list(examples)
    chosen = np.random.default_rng(_SUBSET_SEED).choice(len(examples), max_examples, replace=False)
    return [examples[i] for i in sorted(chosen)]


def write_outputs(result: FewShotResult, summary: dict, output_dir: str) -> None:
    """results.json (the summary) and predictions.tsv (one row per example: idx, label, prediction, the score
    of each label word, demonstrations kept)."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    header = ["idx", "label", "prediction", *(f"score_{w}" for w in result.fmt.label_words), "demonstrations"]
    lines = ["\t".join(header)]
    for e, p, s, fp in zip(result.examples, result.predictions, result.scores, result.prompts):
        words = result.fmt.label_words
        lines.append("\t".join([str(e.idx), words[int(e.label)], words[int(p)], *(f"{v:.6f}" for v in s),
                                str(fp.num_demonstrations)]))
    with open(os.path.join(output_dir, "predictions.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def run(init: str, task_name: str, *, k: int, seed: int, glue_dir: str, glue_source: str = "dir",
        split: str = "dev", max_examples: int = 0, normalize: bool = False, balanced: bool = False,
        label_words: Sequence[str] = (), batch_size: int = 8, tokenizer_path: str = "",
        output_dir: str = "") -> tuple[FewShotResult, dict]:
    """The command: load the LM and the GLUE splits, evaluate, optionally write DIR/results.json + predictions."""
    task = glue.get_task(task_name)
    prompts.prompt_format(task, label_words)  # a regression task or bad label words fail before loading anything
    if batch_size < 1:
        raise UserError(f"--batch_size={batch_size} must be >= 1")
    split = task.dev_splits[0] if split == "dev" else split
    if split not in task.dev_splits:
        raise UserError(f"--split={split!r}: few-shot evaluation needs labels, i.e. one of "
                        f"{', '.join(task.dev_splits)} (test splits have none)")
    lm = load_language_model(init, tokenizer_path=tokenizer_path)
    # pretrain.fewshot's flags, for the errors
    options = glue.DataOptions(glue_dir="--glue_dir", tfds="--glue_source=tfds", skip_malformed=None)
    train = glue.load_split(task, "train", source=glue_source, data_dir=glue_dir, options=options)
    examples = glue.load_split(task, split, source=glue_source, data_dir=glue_dir, options=options)
    examples = subset(examples, max_examples)
    result = evaluate_fewshot(task, examples, train, lm.tokenizer, lm_scorer(lm, normalize=normalize,
                              batch_size=batch_size), k=k, seed=seed, max_length=lm.config.n_positions,
                              balanced=balanced, label_words=label_words, split=split)
    summary = {**result.summary(), "split": split, "k": k, "seed": seed, "balanced": balanced,
               "normalize": normalize, "model": lm.source, "context": lm.config.n_positions,
               "first_prompt": result.prompts[0].text}
    if output_dir:
        write_outputs(result, summary, output_dir)
    return result, summary


def report(result: FewShotResult, summary: dict) -> str:
    first = result.prompts[0]
    read = (f"; the model read only its last {len(first.ids)} tokens, {first.num_truncated} were cut from the left"
            if first.num_truncated else "")
    lines = [f"first prompt ({first.num_demonstrations} demonstrations{read}), completed by "
             + " | ".join(repr(c) for c in prompts.completions(result.fmt)) + ":",
             "-" * 60, first.text, "-" * 60]
    for name in ("metrics", "majority_baseline"):
        values = summary[name]
        lines.append(f"{name}: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in values.items()))
    s = summary
    lines.append(f"{s['task']} {s['split']}: {s['num_examples']} examples, k={s['k']}, mean demonstrations "
                 f"{s['mean_demonstrations']:.2f} (dropped {s['mean_dropped_demonstrations']:.2f} on average to fit "
                 f"{s['context']} tokens), {s['truncated_prompts']} prompts truncated, predictions "
                 f"{s['prediction_counts']}")
    return "\n".join(lines)
