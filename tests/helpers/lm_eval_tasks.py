"""Local lm-evaluation-harness tasks over JSON-lines files (nothing downloaded): a multiple-choice task, a
rolling-perplexity task and a generate_until task, written into a folder for --include_path; and a byte-level BPE
tokenizer.json with GPT-2's <|endoftext|>, for GPT runs that export with their tokenizer."""
from __future__ import annotations

import json
import os

from tests.helpers.modernbert import training_texts

TASKS = ("tiny_choice", "tiny_rolling", "tiny_generate")

_HEADER = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
"""
_BODIES = {
    "tiny_choice": """output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
  - {metric: acc_norm, aggregation: mean, higher_is_better: true}
""",
    "tiny_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}
""",
    "tiny_generate": """output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true}
""",
}


def _documents() -> dict[str, list[dict]]:
    lines = [line for line in training_texts()[:400] if len(line.split()) >= 5]
    choice = [{"context": " ".join(line.split()[:3]), "choices": [" " + " ".join(other.split()[3:6])
                                                                  for other in (line, *lines[i + 1:i + 4])],
               "label": 0} for i, line in enumerate(lines[:12])]
    rolling = [{"text": "\n".join(lines[i:i + 2])} for i in range(0, 10, 2)]
    rolling.append({"text": " ".join(lines[40:48])})  # longer than the context: several windows
    generate = [{"prompt": " ".join(line.split()[:4]), "answer": " " + line.split()[4]} for line in lines[50:60]]
    return {"tiny_choice": choice, "tiny_rolling": rolling, "tiny_generate": generate}


def write_tasks(directory: str) -> str:
    """The three tasks' YAMLs and JSON-lines files in `directory` -> the directory (lm-eval's --include_path)."""
    os.makedirs(directory, exist_ok=True)
    for task, documents in _documents().items():
        data = os.path.join(directory, f"{task}.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(document) + "\n" for document in documents)
        with open(os.path.join(directory, f"{task}.yaml"), "w", encoding="utf-8") as f:
            f.write(_HEADER.format(task=task, data=json.dumps(data)) + _BODIES[task])
    return directory


def write_gpt_bpe_tokenizer(path: str, vocab_size: int = 320) -> str:
    """A GPT-2-shaped byte-level BPE tokenizer.json (ByteLevel pre-tokenizer and decoder, <|endoftext|> special)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(training_texts(), trainers.BpeTrainer(
        vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok.save(path)
    return path
