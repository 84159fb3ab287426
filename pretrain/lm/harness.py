"""lm-evaluation-harness's model type `lmpretrain`: this project's checkpoints under EleutherAI's task suite.

    python -m pretrain.lm_eval --model lmpretrain --model_args workdir=runs/gpt_small --tasks hellaswag,lambada_openai

`workdir` is a pretrain.train workdir or a Hugging Face directory. The family decides what the model type does, each
as lm-eval's `hf` type does it for the transformers class the run exports as:

  GPT (decoder-only)  loglikelihood, loglikelihood_rolling, generate_until (pretrain/lm/language_model.py's
                      next-token scores; KV-cache generation from pretrain/lm/generation.py, greedy or sampled)
  T5                  the encoder reads the context (with its end of sequence), the decoder scores or writes the
                      continuation (pretrain/lm/encoder_decoder.py); rolling windows give the encoder the prefix
                      token alone, as the `hf` type's seq2seq path; greedy generation only
  masked LMs          loglikelihood as the pseudo-log-likelihood of the continuation with the context visible
  (BERT, ALBERT,      (pretrain/lm/masked_lm.py; `pll=within_word_l2r` for Kauf & Ivanova's variant), and
   ModernBERT,        loglikelihood_rolling as the PLL of the text in chunks of the position table: what BLiMP-style
   ELECTRA's          minimal pairs and multiple-choice tasks need. They do not generate.
   generator)

Other model_args: batch_size (rows a call), prefix_token_id (what an empty context starts from; default the end of
text, [CLS] for a masked LM), tokenizer_path (replaces the one the run names), max_gen_toks (default 256), max_length
(T5's longest input, default 512), seed (sampled generation).

Requests are tokenized as lm-eval's TemplateLM does (the context's trailing spaces moved into the continuation; for
a decoder or a masked LM the whole text encoded once and split at the context), so a token list here is the one the
`hf` type scores.
"""
from __future__ import annotations

import itertools

import jax
from lm_eval import utils as harness_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

import models
from objectives.interface import eos_id_or_none
from pretrain.lm import encoder_decoder, generation, language_model, masked_lm
from pretrain.runtime.errors import UserError
from pretrain.training.pretrained import family_of

NAME = "lmpretrain"


def _load(path: str, tokenizer_path: str, pll: str, max_length: int):
    """-> (kind: 'causal' | 'seq2seq' | 'masked', the loaded model, its longest row)."""
    family = family_of(path, "workdir")
    known = family in models.FAMILIES
    if known and models.family(family).causal:
        lm = language_model.load_language_model(path, tokenizer_path=tokenizer_path, flag="workdir")
        return "causal", lm, lm.config.n_positions
    if known and models.family(family).encoder_decoder:
        return "seq2seq", encoder_decoder.load_seq2seq(path, tokenizer_path=tokenizer_path), max_length
    if family in masked_lm.MASKED_LMS:
        masked_lm.check_variant(pll)
        lm = masked_lm.load_masked_lm(path, tokenizer_path=tokenizer_path)
        return "masked", lm, lm.max_length
    raise UserError(f"workdir={path} holds a {family} model, which lm-eval cannot score here: give a GPT, a T5 or a "
                    f"masked LM ({', '.join(masked_lm.MASKED_LMS.names())}) workdir or Hugging Face directory")


@register_model(NAME)
class PretrainLM(TemplateLM):
    def __init__(self, workdir: str = "", pretrained: str = "", batch_size: int | str = 8, max_gen_toks: int = 256,
                 prefix_token_id: int | None = None, tokenizer_path: str = "", pll: str = "original", seed: int = 0,
                 max_length: int = 512, device: str | None = None, max_batch_size: int | None = None, **unknown):
        super().__init__()  # device and max_batch_size: what lm-eval passes every model type (JAX places itself)
        if unknown:
            raise UserError(f"--model_args {', '.join(sorted(unknown))}: not a key of {NAME} (its keys: workdir, "
                            "batch_size, max_gen_toks, prefix_token_id, tokenizer_path, pll, seed, max_length)")
        path = workdir or pretrained
        if not path:
            raise UserError(f"--model {NAME} needs --model_args workdir=PATH (a pretrain.train workdir or a Hugging "
                            "Face directory)")
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8  # "auto": lm-eval's torch probing
        self.max_gen_toks, self.seed, self.pll = int(max_gen_toks), int(seed), pll
        self.kind, self.lm, self.max_length = _load(path, tokenizer_path, pll, int(max_length))
        self.backend = "seq2seq" if self.kind == "seq2seq" else "causal"  # how TemplateLM splits a request's text
        self.tokenizer = self.lm.tokenizer
        self._prefix = None if prefix_token_id is None else int(prefix_token_id)

    # ----- what TemplateLM needs -----
    @property
    def eot_token_id(self) -> int | None:
        return eos_id_or_none(self.tokenizer)

    @property
    def prefix_token_id(self) -> int:
        if self._prefix is not None:
            return self._prefix
        start = self.tokenizer.cls_id if self.kind == "masked" else self.eot_token_id
        if start is None:
            raise UserError(f"{self.tokenizer!r} has no end-of-text token for an empty context to start from; give "
                            "--model_args prefix_token_id=ID")
        return start

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The text's tokens; a T5's input ends with its end of sequence, as transformers' T5 tokenizer adds it
        (GPT-2's adds nothing; the PLL rows place [CLS] and [SEP] themselves)."""
        ids = self.tokenizer.encode(string)
        return ids + [self.eot_token_id] if self.kind == "seq2seq" and add_special_tokens is not False else ids

    def tok_decode(self, tokens: list[int]) -> str:
        eos = self.eot_token_id
        return self.tokenizer.decode([t for t in tokens if t != eos])

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        if self.kind == "masked":
            return masked_lm.score(self.lm, [("".join(texts), context, continuation)
                                             for texts, context, continuation in requests], self.pll)
        return self._scores([(context, continuation) for _, context, continuation in requests])

    def _scores(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        if self.kind == "seq2seq":  # the encoder reads at most max_length tokens, as the hf type cuts them
            pairs = [(context[-self.max_length:], continuation[-self.max_length:]) for context, continuation in pairs]
            return encoder_decoder.continuation_scores(self.lm, pairs, batch_size=self.batch_size)
        return language_model.continuation_scores(self.lm, pairs, batch_size=self.batch_size)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The whole text's log-likelihood: lm-eval's disjoint rolling windows of max_length tokens (a GPT, a T5),
        or the PLL of chunks of the position table less [CLS] and [SEP] (a masked LM)."""
        totals = []
        for (text,) in [request.args for request in requests]:
            tokens = self.tok_encode(text)  # a T5's ends with its end of sequence, as the hf type's
            if self.kind == "masked":
                size = self.max_length - 2
                scores = masked_lm.score(self.lm, [("", [], tokens[i:i + size])
                                                   for i in range(0, len(tokens), size)], self.pll)
            else:
                windows = harness_utils.get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)
                scores = self._scores([harness_utils.make_disjoint_window(window) for window in windows])
            totals.append(sum(score for score, _ in scores))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (a GPT with do_sample: sampled) continuations, cut at the first stop string, the end of text being
        one; requests with the same settings decode in batches of batch_size."""
        if self.kind == "masked":
            raise UserError(f"a masked LM ({self.lm.family}) does not generate text: give loglikelihood or "
                            "multiple-choice tasks (BLiMP, ...), or a GPT or T5 workdir for generate_until tasks")
        eos = self.eot_token_id
        out: list[str | None] = [None] * len(requests)
        keyed = sorted((repr(sorted(request.args[1].items())), i) for i, request in enumerate(requests))
        for _, group in itertools.groupby(keyed, key=lambda k: k[0]):
            indices = [i for _, i in group]
            kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None),
                                          eos=None if eos is None else self.tokenizer.decode([eos]))
            # a GPT's row ends at an id whose text holds a stop string: a pass over the vocabulary, once per group
            stop_ids = set(generation.stop_token_ids(self.tokenizer, until) if self.kind == "causal" else ())
            stop_ids |= {eos} if eos is not None else set()
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start:start + self.batch_size]
                new = self._generate([requests[i].args[0] for i in chunk], sorted(stop_ids), kwargs)
                for i, tokens in zip(chunk, new):
                    out[i] = postprocess_generated_text(self.tok_decode(tokens), until, None)
        return out

    def _generate(self, contexts: list[str], stop_ids: list[int], kwargs: dict) -> list[list[int]]:
        max_gen_toks = int(kwargs["max_gen_toks"])
        if self.kind == "seq2seq":
            inputs = [self.tok_encode(context)[-self.max_length:] for context in contexts]
            return encoder_decoder.generate_greedy(self.lm, inputs, max_gen_toks)
        room = self.max_length - max_gen_toks
        if room <= 0:
            raise UserError(f"max_gen_toks={max_gen_toks} leaves no room for a context in the model's "
                            f"{self.max_length} positions; give the task a smaller max_gen_toks")
        prompts = [self.tok_encode(context)[-room:] or [self.prefix_token_id] for context in contexts]
        sampling = generation.Sampling(greedy=not kwargs.get("do_sample"), temperature=float(kwargs.get(
            "temperature", 1.0) or 1.0), top_k=int(kwargs.get("top_k", 0) or 0), top_p=float(kwargs.get("top_p", 1.0)))
        return generation.generate_ids(self.lm.model, self.lm.params, prompts, max_gen_toks, sampling=sampling,
                                       rng=jax.random.key(self.seed), stop_ids=stop_ids)
