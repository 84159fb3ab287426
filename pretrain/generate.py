"""Text generation from a trained GPT, as nanoGPT's sample.py.

  python -m pretrain.generate --init=runs/shakespeare --prompt="ROMEO:" --prompt="JULIET:" \
      [--prompt_file=FILE] [--max_new_tokens=500 --temperature=0.8 --top_k=200 --top_p=1.0] \
      [--num_samples=1 --seed=0 --stop='\\n\\n' --greedy --tokenizer_path=PATH]

The work is done by pretrain/lm/generation.py, whose docstring has the details.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import sys

from absl import flags

from pretrain.runtime import cli, errors

_INIT = flags.DEFINE_string("init", None, "A pretrain.train GPT workdir or a Hugging Face GPT-2 directory.")
_PROMPT = flags.DEFINE_multi_string("prompt", None, "A prompt (repeat for several); backslash escapes allowed.")
_PROMPT_FILE = flags.DEFINE_string("prompt_file", None, "A text file, one prompt per non-blank line.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 500,
                                       "Tokens to generate per sample, at most 1,000,000 (nanoGPT: 500).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 = greedy (nanoGPT: 0.8).")
_TOP_K = flags.DEFINE_integer("top_k", 200, "Sample among the k most likely tokens; 0 = all (nanoGPT: 200).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = off.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Samples per prompt.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed of the sampling.")
_STOP = flags.DEFINE_multi_string("stop", [], "A stop string (repeatable): the completion is cut before it.")
_GREEDY = flags.DEFINE_bool("greedy", False, "Argmax decoding instead of sampling.")
_TOKENIZER_PATH = flags.DEFINE_string("tokenizer_path", "", "Replaces the tokenizer path the checkpoint names.")
flags.mark_flags_as_required(["init"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.lm import (  # imported late so that --help and flag errors stay fast
        generation,
        language_model,
    )
    with errors.one_line_errors():
        # the settings first: a bad value fails before the model is loaded
        generation.check_max_new_tokens(_MAX_NEW_TOKENS.value)
        sampling = generation.Sampling(greedy=_GREEDY.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                                       top_p=_TOP_P.value)
        prompts = generation.read_prompts(_PROMPT.value, _PROMPT_FILE.value)
        lm = language_model.load_language_model(_INIT.value, tokenizer_path=_TOKENIZER_PATH.value)
        results = generation.generate(lm, prompts, max_new_tokens=_MAX_NEW_TOKENS.value, sampling=sampling,
                                      num_samples=_NUM_SAMPLES.value, seed=_SEED.value,
                                      stop=[generation.unescape(s) for s in _STOP.value])
    print(generation.format_completions(results))


if __name__ == "__main__":
    sys.exit(cli.run(main))
