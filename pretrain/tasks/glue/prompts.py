"""Instruction prompts with demonstrations for GLUE classification (few-shot in-context learning).

The format is the polarity example of Xiao & Zhu 2025, "Foundations of Large Language Models", Section
1.1.2 (prompting of pre-trained models): a description of the task that names the label set, then k
demonstrations (input indicator + input, output indicator + label), then the test input and the output
indicator, whose completion the model is asked for:

    Assume that the polarity of a text is a label chosen from {negative, positive}. Identify the polarity of the input.

    Input: the weather here is wonderful .
    Polarity: positive

    Input: i love the food here .
    Polarity:

Blocks (instruction, each demonstration, the query) are joined by one blank line ("\\n\\n"); a pair task
writes its two inputs as two indicated lines ("Sentence 1: ...\\nSentence 2: ..."). Input fields are
stripped of surrounding whitespace. A candidate completion is " " + label word: the space belongs to
the completion, as in GPT-3's evaluation (Brown et al. 2020, Section 2.4 / Appendix G) and
lm-evaluation-harness, so that a BPE vocabulary reads the word as the " word" token it saw in training.

Label words are natural-language words, one table (`FORMATS`): T5's label names (text_to_text.py,
GlueTask.labels) are identifiers such as "not_equivalent", which a language model has rarely read as
an answer; for SST-2 and CoLA the words are T5's. They are written in lower case both in the label set
and as answers (Xiao & Zhu's example capitalises its answers; one spelling keeps the label set and the
answers the same strings).

Demonstrations (`DemonstrationSampler`) are drawn at random from the train split, afresh for every
evaluated example, as in GPT-3 ("randomly drawing K examples from that task's training set"), with a
generator seeded by (seed, example.idx): the same demonstrations for an example whatever the batch or
the subset evaluated. Training examples with the same text as the evaluated one are never drawn.
`balanced=True` draws k // C per class (the k % C extra ones go to classes chosen at random); the
default draws uniformly, so demonstrations follow the train split's label distribution.

Context overflow (`fit_prompt`): demonstrations are dropped oldest (first in the prompt) first until
prompt + longest candidate fits the model's context; if even the zero-shot prompt does not fit, the
prompt's tokens are cut from the left (the instruction goes first, then the start of the input), as
lm-evaluation-harness does: the end of the input and the output indicator, which the label word
follows, always stay.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from pretrain.runtime.errors import UserError
from pretrain.tasks.glue.data import Example, GlueTask, get_task

BLOCK_SEPARATOR = "\n\n"
_LABELS = "{labels}"  # where the instruction names the label set


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    instruction: str                    # task description; "{labels}" becomes "{word, word, ...}"
    input_indicators: tuple[str, ...]   # one per input field: ("Input",) or ("Sentence 1", "Sentence 2")
    output_indicator: str               # the completion follows "<output_indicator>:"
    label_words: tuple[str, ...]        # one per class, in GlueTask.labels order


_PARAPHRASE = "Assume that whether two sentences are paraphrases is a label chosen from {labels}. " \
              "Identify whether the input sentences are paraphrases."
_IMPLIES = "Assume that whether a premise implies a hypothesis is a label chosen from {labels}. " \
           "Identify whether the input premise implies the hypothesis."
FORMATS: dict[str, PromptFormat] = {
    "sst2": PromptFormat("Assume that the polarity of a text is a label chosen from {labels}. "
                         "Identify the polarity of the input.", ("Input",), "Polarity", ("negative", "positive")),
    "cola": PromptFormat("Assume that the acceptability of a sentence is a label chosen from {labels}. "
                         "Identify the acceptability of the input.", ("Input",), "Acceptability",
                         ("unacceptable", "acceptable")),
    "mrpc": PromptFormat(_PARAPHRASE, ("Sentence 1", "Sentence 2"), "Paraphrase", ("no", "yes")),
    "qqp": PromptFormat("Assume that whether two questions ask the same thing is a label chosen from {labels}. "
                        "Identify whether the input questions ask the same thing.", ("Question 1", "Question 2"),
                        "Same", ("no", "yes")),
    # entailment, neutral, contradiction
    "mnli": PromptFormat(_IMPLIES, ("Premise", "Hypothesis"), "Implied", ("yes", "maybe", "no")),
    # entailment, not_entailment
    "qnli": PromptFormat("Assume that whether a sentence answers a question is a label chosen from {labels}. "
                         "Identify whether the input sentence answers the question.", ("Question", "Sentence"),
                         "Answers", ("yes", "no")),
    "rte": PromptFormat(_IMPLIES, ("Premise", "Hypothesis"), "Implied", ("yes", "no")),
    # not_entailment, entailment: sentence 2 is sentence 1 with a pronoun replaced
    "wnli": PromptFormat("Assume that whether a first sentence implies a second is a label chosen from {labels}. "
                         "Identify whether input sentence 1 implies sentence 2.", ("Sentence 1", "Sentence 2"),
                         "Implied", ("no", "yes")),
}


def prompt_format(task: GlueTask | str, label_words: Sequence[str] = ()) -> PromptFormat:
    """The task's format; `label_words` (one per class, GlueTask.labels order) replaces the table's."""
    task = get_task(task) if isinstance(task, str) else task
    if task.is_regression:
        raise UserError(f"GLUE task {task.name!r} is a regression task; few-shot prompting here picks one of "
                        "a set of label words (choose a classification task)")
    fmt = FORMATS[task.name]
    if label_words:
        words = tuple(w.strip() for w in label_words)
        if len(words) != task.num_labels or not all(words) or len(set(words)) != len(words):
            raise UserError(f"--label_words={','.join(label_words)}: {task.name} needs {task.num_labels} distinct "
                            f"non-empty words, one per class in the order {', '.join(task.labels)}")
        fmt = dataclasses.replace(fmt, label_words=words)
    return fmt


def instruction_text(fmt: PromptFormat) -> str:
    return fmt.instruction.replace(_LABELS, "{" + ", ".join(fmt.label_words) + "}")


def query_text(fmt: PromptFormat, example: Example) -> str:
    """'Input: <text>\\nPolarity:' (the block of the evaluated example, without its answer)."""
    fields = (example.text_a, example.text_b)[:len(fmt.input_indicators)]
    lines = [f"{indicator}: {text.strip()}" for indicator, text in zip(fmt.input_indicators, fields)]
    return "\n".join([*lines, f"{fmt.output_indicator}:"])


def template_text(fmt: PromptFormat) -> str:
    """What every prompt holds whatever its examples: the instruction (with its "{word, ...}" label set) and
    the indicators. A tokenizer that cannot encode it fails on the format, not on an example."""
    return BLOCK_SEPARATOR.join([instruction_text(fmt), query_text(fmt, Example("", "", 0, -1))])


def completions(fmt: PromptFormat) -> list[str]:
    """The candidate completions, one per class: ' <label word>'."""
    return [" " + word for word in fmt.label_words]


def demonstration_text(fmt: PromptFormat, example: Example) -> str:
    return query_text(fmt, example) + completions(fmt)[int(example.label)]


def build_prompt(fmt: PromptFormat, demonstrations: Sequence[Example], example: Example) -> str:
    """Instruction, demonstrations (in the given order), the query: the text the completion follows."""
    blocks = [instruction_text(fmt), *(demonstration_text(fmt, d) for d in demonstrations), query_text(fmt, example)]
    return BLOCK_SEPARATOR.join(blocks)


# ----------------------------------------------------------------------------------------------
# Demonstrations.


def _text_key(example: Example) -> tuple[str, str | None]:
    return example.text_a, example.text_b


class DemonstrationSampler:
    """k training examples per evaluated example: random, seeded by (seed, example.idx), never one with the
    evaluated example's text. `balanced`: k // C per class, the k % C others to random classes."""

    def __init__(self, pool: Sequence[Example], k: int, *, seed: int, num_labels: int, balanced: bool = False):
        if k < 0:
            raise UserError(f"--k={k}: the number of demonstrations must be >= 0")
        self.pool, self.k, self.seed, self.num_labels, self.balanced = list(pool), k, seed, num_labels, balanced
        labels = np.array([int(e.label) for e in self.pool], np.int64)
        self._by_class = [np.flatnonzero(labels == c) for c in range(num_labels)] if balanced else [
            np.arange(len(self.pool))]
        quota = -(-k // num_labels) if balanced else k  # the most one group may have to give
        for c, group in enumerate(self._by_class):
            if quota > len(group):
                what = f"class {c} of the train split has {len(group)} examples" if balanced \
                    else f"the train split has {len(group)} examples"
                raise UserError(f"--k={k} is larger than the pool of demonstrations: {what} (use a smaller --k"
                                + (" or --balanced=false)" if balanced else ")"))
        self._duplicates: dict[tuple, set[int]] = {}
        for i, e in enumerate(self.pool):
            self._duplicates.setdefault(_text_key(e), set()).add(i)

    def sample(self, example: Example) -> list[Example]:
        """The demonstrations for `example`, in prompt order."""
        if self.k == 0:
            return []
        rng = np.random.default_rng([self.seed, example.idx])
        excluded = self._duplicates.get(_text_key(example), set())
        if self.balanced:
            counts = np.full(self.num_labels, self.k // self.num_labels)
            counts[rng.choice(self.num_labels, self.k % self.num_labels, replace=False)] += 1
        else:
            counts = [self.k]
        chosen = []
        for group, count in zip(self._by_class, counts):
            # Over-draw by the excluded ones: a uniform draw without replacement, minus them, is still uniform.
            extra = len(excluded)
            draw = rng.choice(group, size=min(len(group), count + extra), replace=False)
            kept = [int(i) for i in draw if int(i) not in excluded][:count]
            if len(kept) < count:
                raise UserError(f"--k={self.k}: too few training examples differ from evaluated example "
                                f"{example.idx} (use a smaller --k)")
            chosen += kept
        if self.balanced:
            chosen = [chosen[i] for i in rng.permutation(len(chosen))]
        return [self.pool[i] for i in chosen]


# ----------------------------------------------------------------------------------------------
# Fitting the context.


@dataclasses.dataclass(frozen=True)
class FittedPrompt:
    text: str                  # the prompt with the demonstrations kept (before any left truncation)
    ids: list[int]             # what the model reads: at most `budget` tokens
    num_demonstrations: int    # kept
    num_dropped: int           # demonstrations dropped (oldest first) to fit
    num_truncated: int         # tokens cut from the left because even the zero-shot prompt did not fit


def fit_prompt(fmt: PromptFormat, demonstrations: Sequence[Example], example: Example,
               encode: Callable[[str], list[int]], budget: int) -> FittedPrompt:
    """The longest prompt of the newest demonstrations whose tokens fit `budget` (the context minus the
    longest completion); a zero-shot prompt that does not fit keeps its last `budget` tokens."""
    if budget < 1:
        raise UserError(f"the model's context leaves {budget} tokens for the prompt after the longest label word "
                        "(use shorter --label_words or a model with a longer context)")
    for dropped in range(len(demonstrations) + 1):
        kept = demonstrations[dropped:]
        text = build_prompt(fmt, kept, example)
        ids = encode(text)
        if len(ids) <= budget:
            return FittedPrompt(text, ids, len(kept), dropped, 0)
    return FittedPrompt(text, ids[-budget:], 0, len(demonstrations), len(ids) - budget)
