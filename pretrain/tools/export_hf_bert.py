"""Exports a BERT-family checkpoint of ours to a Hugging Face directory (config.json + model.safetensors).

  python -m pretrain.tools.export_hf_bert --workdir runs/bert_base --output hf/bert_base
  python -c "from transformers import BertForPreTraining; BertForPreTraining.from_pretrained('hf/bert_base')"

A pretraining run with model.shared_layers (configs/albert.py) exports as ALBERT: AlbertForPreTraining (the NSP
head is the SOP head), with its SentencePiece model as spiece.model:

  python -m pretrain.tools.export_hf_bert --workdir runs/albert_tiny --output hf/albert_tiny
  python -c "from transformers import AlbertForPreTraining; AlbertForPreTraining.from_pretrained('hf/albert_tiny')"

An ELECTRA pretraining run (configs/electra.py) exports as two directories, OUTPUT/discriminator
(ElectraForPreTraining) and OUTPUT/generator (ElectraForMaskedLM), sharing their embeddings. A distillation
run (configs/distil.py) exports its student as DistilBertForMaskedLM (no token types, no pooler); a fine-tuned
student exports as BERT, with a token-type table of zeros. A ModernBERT run (configs/modernbert.py) exports as
ModernBertForMaskedLM, its fine-tuning runs as ModernBertFor{SequenceClassification, TokenClassification,
QuestionAnswering} (id2label: the task's labels); its tokenizer goes along as tokenizer.json (+ tokenizer_config.json
for AutoTokenizer): an hf_json tokenizer as it is, a SentencePiece or WordPiece one converted and checked to encode
as ours (a literal "[MASK]" in text aside, which transformers takes for the special token), or left out with a note:

  python -m pretrain.tools.export_hf_bert --workdir runs/modernbert_tiny --output hf/modernbert_tiny
  python -c "from transformers import ModernBertForMaskedLM as M; M.from_pretrained('hf/modernbert_tiny')"

--workdir is a pretrain.train workdir (the latest checkpoint, or --step) or a pretrain.finetune workdir (its
best checkpoint). A fine-tuning workdir exports as a BertForSequenceClassification: the encoder, its pooler
and the task head (`classifier`, with the task's label names); a tagging run (configs/tagging.py) as a
BertForTokenClassification (tags as id2label) and a QA run (configs/qa.py) as a BertForQuestionAnswering.
The span head has no transformers class.

A parameter-efficient run (pretrain.finetune with peft=...; its checkpoint holds only what trained) is rebuilt
over the base it names, checked by fingerprint:
  lora     merged into the base weights (W + alpha / r * A B): a plain BertForSequenceClassification directory;
           with --peft, unmerged: a peft directory (adapter_config.json + adapter_model.safetensors, the
           classifier as modules_to_save)
  prefix   --peft only (prefix-tuning adds keys and values, not weight updates: nothing to merge); peft's
  prompt   directory holds the prefix table [P, 2 * L * D] (the MLP's output) or the prompt embeddings [P, D]
  adapters no export: the peft library has no bottleneck adapters, and they cannot be merged either

  python -m pretrain.tools.export_hf_bert --workdir runs/mrpc_lora --output hf/mrpc_lora
  python -m pretrain.tools.export_hf_bert --workdir runs/mrpc_lora --output hf/mrpc_lora_peft --peft
  python -c "from transformers import BertForSequenceClassification as B; from peft import PeftModel; \
      PeftModel.from_pretrained(B.from_pretrained('BASE', num_labels=2), 'hf/mrpc_lora_peft')"

BASE is the run's --config.init when that is a Hugging Face directory (adapter_config.json names it, for
AutoPeftModelForSequenceClassification); a pretrain.train base is exported first, with this script.
A WordPiece vocab.txt is copied beside the weights (not into a peft directory: the base has it); a
SentencePiece model is not a format transformers' BertTokenizer reads, so it is left out with a note.

Two registries say what exports: EXPORTERS, each model family's exporter (registered beside its function by
`@exporter(name)`), and PEFT_EXPORTS, the form each PEFT method's fine-tuning runs take (merged, a peft directory,
or neither and why).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable

import ml_collections
import numpy as np

import models
from models import peft as peft_modules
from models.convert import hf_distilbert, hf_electra, hf_modernbert, peft_io, save_hf_albert, save_hf_bert
from models.convert.hf_gpt2 import save_hf_gpt2
from models.qkv_layout import hf_layout
from models.registry import Registry
from objectives import task_heads
from objectives.interface import eos_id_or_none
from pretrain.data import tokenizers as data_tokenizers
from pretrain.finetuners import registry
from pretrain.finetuners.base import model_config
from pretrain.runtime import errors
from pretrain.tasks import registry as task_registry
from pretrain.tasks.base import Task
from pretrain.training import peft as parameter_efficient
from pretrain.workdir import checkpoints


@dataclasses.dataclass(frozen=True)
class Exporter:
    """How one model family's runs export."""
    export: Callable[..., str]  # (workdir, config, output, step, peft) -> what was written
    peft: bool = False          # it exports a parameter-efficient fine-tuning run unmerged, with --peft


# config.model.name -> its Exporter, registered beside the function by `@exporter(name)`
EXPORTERS: Registry[Exporter] = Registry("exporter", key="config.model.name", error=errors.UserError)


def exporter(name: str, peft: bool = False):
    """A decorator: the function exports config.model.name `name`'s runs (with `peft`, --peft ones too)."""
    def register(export_run: Callable[..., str]) -> Callable[..., str]:
        EXPORTERS.register(name, Exporter(export_run, peft))
        return export_run
    return register


@dataclasses.dataclass(frozen=True)
class PeftExport:
    """The forms a fine-tuning run of one PEFT method exports as: merged into plain transformers weights (without
    --peft) and as a peft library directory (--peft); `refused` says why, where the flag asks for a missing one."""
    merge: Callable[[dict, object], dict] | None = None  # (params, PEFT config) -> the weights with its own merged
    unmerged: bool = False                               # a peft directory (--peft)
    full: bool = False                                   # every weight trained: the checkpoint is the whole model
    note: str = ""                                       # what the merged export's message adds
    refused: str = ""                                    # "{workdir} trained ..." where a form is missing


def _merge_lora(params: dict, spec) -> dict:
    """W + alpha / r * A B in every LoRA target, in the layout the converters read."""
    return peft_modules.merge_lora(hf_layout(params), spec.lora_alpha / spec.lora_rank)


VIRTUAL_TOKENS = ("{workdir} trained peft.method={method}, which adds virtual tokens rather than weight updates and "
                  "cannot be merged into BERT: export it with --peft")
PEFT_EXPORTS: Registry[PeftExport] = Registry("PEFT method", key="peft.method", error=errors.UserError)
PEFT_EXPORTS.register("none", PeftExport(merge=lambda params, spec: params, full=True, refused=(
    "--peft exports a parameter-efficient run; {workdir} fine-tuned every weight (peft.method=none): export it "
    "without --peft")))
PEFT_EXPORTS.register("lora", PeftExport(merge=_merge_lora, unmerged=True, note=" (LoRA merged)"))
PEFT_EXPORTS.register("prefix", PeftExport(unmerged=True, refused=VIRTUAL_TOKENS))
PEFT_EXPORTS.register("prompt", PeftExport(unmerged=True, refused=VIRTUAL_TOKENS))
PEFT_EXPORTS.register("adapters", PeftExport(refused=(
    "{workdir} trained peft.method=adapters: the peft library has no bottleneck adapters (no --peft export), and "
    "adapters add layers rather than weight updates, so they cannot be merged into BERT either")))


def export(workdir: str, output: str, step: int | None = None, peft: bool = False) -> str:
    config_path = os.path.join(workdir, "config.json")
    if not os.path.isfile(config_path):
        raise errors.UserError(f"{config_path} not found: --workdir must be a pretrain.train or "
                               "pretrain.finetune workdir")
    with open(config_path) as f:
        config = json.load(f)
    name = (config.get("model") or {}).get("name", "bert")
    if name not in EXPORTERS:  # a T5 run: no exporter registered for its family
        raise errors.UserError(f"pretrain.tools.export_hf_bert exports {', '.join(EXPORTERS.names())} runs, and "
                               f"{workdir} holds a {name} model")
    family_exporter = EXPORTERS.get(name)
    if peft and not family_exporter.peft:
        raise errors.UserError(f"--peft exports a parameter-efficient BERT fine-tuning run, and {workdir} holds a "
                               f"{name} model: export it without --peft")
    return family_exporter.export(workdir, config, output, step, peft)


@exporter("bert", peft=True)
def export_bert(workdir: str, config: dict, output: str, step: int | None, peft: bool) -> str:
    """A BERT pretraining run (as BERT, ALBERT or DistilBERT, by its shape) or fine-tuning run (PEFT included)."""
    if "task" in config:
        return export_finetuned(workdir, ml_collections.ConfigDict(config), output, step, peft)
    if peft:
        raise errors.UserError(f"--peft exports a parameter-efficient fine-tuning run; {workdir} is a pretraining "
                               "workdir: export it without --peft")
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
    params = {k: v for k, v in params.items() if k in ("bert", "mlm_head", "nsp_head")}  # the pretraining heads
    model = models.model_config({**config["model"], "next_sentence": "nsp_head" in params})
    return f"exported {workdir} step {step} ({', '.join(params)}) to {output}" + _save(
        output, params, model, config.get("tokenizer", {}))


def _save(output: str, params: dict, model, tokenizer: dict) -> str:
    """A pretraining model's {bert, heads} in the transformers architecture its shape is -> ' as ...'."""
    if model.shared_layers:  # ALBERT: one layer's weights at every depth
        spiece = tokenizer.get("path") if tokenizer.get("kind") == "sentencepiece" else None
        save_hf_albert(output, params, model, spiece_file=spiece, lowercase=tokenizer.get("lowercase", True))
        return " as ALBERT"
    vocab, lowercase = _vocab(tokenizer)
    if not model.type_vocab_size:  # no token types: DistilBERT's shape
        return " as " + hf_distilbert.save_hf_distilbert(output, params, model, vocab_file=vocab, lowercase=lowercase)
    save_hf_bert(output, params, model, vocab_file=vocab, lowercase=lowercase)
    return ""


@exporter("distil")
def export_student(workdir: str, config: dict, output: str, step: int | None, peft: bool = False) -> str:
    """A distillation run -> its student as DistilBertForMaskedLM (the teacher is not written)."""
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
    student = models.model_config(config["model"]).student()
    return f"exported {workdir} step {step} (its student) to {output}" + _save(
        output, params["student"], student, config.get("tokenizer", {}))


@exporter("electra")
def export_electra(workdir: str, config: dict, output: str, step: int | None, peft: bool = False) -> str:
    """An ELECTRA pretraining run -> OUTPUT/discriminator (ElectraForPreTraining) and OUTPUT/generator
    (ElectraForMaskedLM). Its fine-tuning runs are BERTs and export as those."""
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
    vocab, lowercase = _vocab(config.get("tokenizer", {}))
    hf_electra.save_hf_electra(output, params, models.model_config(config["model"]), vocab_file=vocab,
                               lowercase=lowercase)
    return (f"exported {workdir} step {step} to {output}/discriminator (ElectraForPreTraining) and "
            f"{output}/generator (ElectraForMaskedLM)")


@exporter("modernbert")
def export_modernbert(workdir: str, config: dict, output: str, step: int | None, peft: bool = False) -> str:
    """A ModernBERT pretraining run -> ModernBertForMaskedLM; a fine-tuning run -> the ModernBERT class of its head
    kind (sequence / token classification, QA), with the task's labels as id2label. The run's tokenizer goes
    along as a tokenizer.json (`_tokenizer_json`)."""
    kwargs, what = {}, "(modernbert, prediction_head, decoder_bias)"
    if "task" in config:  # checked before any weight is read
        kwargs = _modernbert_task(workdir, ml_collections.ConfigDict(config))
        what = "(modernbert, prediction_head, head)"
    model = models.model_config(config["model"])
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
    if "task" not in config:  # the MLM: the pretraining heads only
        params = {k: v for k, v in params.items() if k in ("modernbert", "prediction_head", "decoder_bias")}
    else:  # the head's outputs, as trained (QA: 2)
        dense = params["head"][hf_modernbert.TASK_CLASSES[kwargs["architecture"]]]
        kwargs["num_labels"] = int(np.shape(dense["kernel"])[-1])
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_file, specials, note = _tokenizer_json(config.get("tokenizer", {}), scratch)
        hf_modernbert.save_hf_modernbert(output, params, model, tokenizer_file=tokenizer_file, special_tokens=specials,
                                         **kwargs)
    architecture = kwargs.get("architecture", hf_modernbert.MASKED_LM)
    return f"exported {workdir} step {step} {what} to {output} as {architecture}{note}"


def _modernbert_task(workdir: str, config: ml_collections.ConfigDict) -> dict:
    """A ModernBERT fine-tuning run's save_hf_modernbert arguments: its head kind's class and the task's labels."""
    method = parameter_efficient.peft_config(config).method
    if not PEFT_EXPORTS.get(method).full:
        raise errors.UserError(f"{workdir} trained peft.method={method}: a ModernBERT run exports only when every "
                               "weight was fine-tuned (peft.method=none)")
    task, head = _exportable_task(workdir, config, peft=False)
    return {"architecture": hf_modernbert.task_class(head.hf_class), "id2label": getattr(task, "labels", ()) or None}


@exporter("gpt")
def export_gpt(workdir: str, config: dict, output: str, step: int | None, peft: bool = False) -> str:
    """A GPT pretraining run -> GPT2LMHeadModel, with its tokenizer as a tokenizer.json where the kind has that form
    (a gpt2_bpe one; a char vocabulary has none), its end of text named bos and eos as GPT-2's."""
    if "task" in config:
        raise errors.UserError(f"{workdir} is a GPT fine-tuning run; only GPT pretraining runs export (as "
                               "GPT2LMHeadModel): export the run its --config.init names")
    model = models.model_config(config["model"])
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_file, specials, note = _tokenizer_json(config.get("tokenizer", {}), scratch, end_of_text=True)
        try:
            save_hf_gpt2(output, params, model, tokenizer_file=tokenizer_file, special_tokens=specials)
        except ValueError as e:  # an architecture GPT2LMHeadModel cannot hold (use_bias=False)
            raise errors.UserError(str(e)) from None
    return f"exported {workdir} step {step} (gpt) to {output} as GPT2LMHeadModel{note}"


def _tokenizer_json(tokenizer: dict, scratch: str, end_of_text: bool = False
                    ) -> tuple[str | None, dict[str, str], str]:
    """config.tokenizer -> (a tokenizer.json that encodes as it does, or None; its specials by tokenizer_config.json's
    names; a note for the message). An hf_json tokenizer is its own file; a SentencePiece or WordPiece one is
    converted into `scratch` (and checked to encode as ours); one that cannot be is left out, with the reason."""
    if not tokenizer.get("path"):
        return None, {}, "; no tokenizer (config.tokenizer.path is empty)"
    loaded = data_tokenizers.from_config(tokenizer)  # a missing file: one line naming it
    specials = data_tokenizers.special_tokens(loaded)
    eos = eos_id_or_none(loaded) if end_of_text else None
    if eos is not None:  # a decoder's end of text (GPT-2: bos and eos are one token)
        specials.update(bos_token=loaded.id_to_piece(eos), eos_token=loaded.id_to_piece(eos))
    if tokenizer.get("kind") == "hf_json":
        return os.path.expanduser(tokenizer["path"]), specials, ""
    try:
        text = data_tokenizers.tokenizer_json(loaded)
    except data_tokenizers.TokenizerError as e:
        return None, specials, f"; its tokenizer is left out: {e}"
    path = os.path.join(scratch, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path, specials, f"; its {tokenizer.get('kind')} tokenizer converted to tokenizer.json"


def export_finetuned(workdir: str, config: ml_collections.ConfigDict, output: str, step: int | None,
                     peft: bool) -> str:
    """A pretrain.finetune workdir -> BertForSequenceClassification (LoRA merged), or with `peft` a peft
    directory; the PEFT methods' base is rebuilt from the reference in the checkpoint."""
    method = parameter_efficient.peft_config(config).method
    form = _peft_form(workdir, method, peft)
    if config.model.get("shared_layers"):
        raise errors.UserError(f"{workdir} fine-tuned an ALBERT (model.shared_layers): only its pretraining run "
                               "exports (as AlbertForPreTraining), not a fine-tuned ALBERT")
    task, head = _exportable_task(workdir, config, peft)
    if form.full:
        params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"), step)
        base = None
    else:
        params, base, step = with_base(config, task, workdir, step)
    model, spec = model_config(config), parameter_efficient.peft_config(config)  # BertConfig, PeftConfig
    if peft:
        peft_io.save_peft_bert(output, params, model, spec, base=base)
        where = repr(base) if base else f"an export of its base ({config.init}, with this script)"
        return (f"exported {workdir} step {step} ({method} + classifier, unmerged) to {output}: load it with "
                f"PeftModel.from_pretrained(BertForSequenceClassification.from_pretrained({where}, "
                f"num_labels={task.num_labels}), {output!r})")
    params = form.merge(params, spec)
    vocab, lowercase = _vocab(config.tokenizer.to_dict())
    peft_io.save_hf_bert_classifier(output, params, model, getattr(task, "labels", ()), architecture=head.hf_class,
                                    vocab_file=vocab, lowercase=lowercase)
    return (f"exported {workdir} step {step} (bert, head{form.note}) to {output} as "
            f"{head.hf_class}")


def _exportable_task(workdir: str, config: ml_collections.ConfigDict, peft: bool):
    """A fine-tuning run's task and head kind; one line where the kind has no transformers class (or with `peft` no
    peft task type), before any weight is read."""
    task = task_registry.task_for_config(config)
    if _export_form(task.kind, peft) is None:
        exportable = [name for name in task_heads.HEAD_KINDS if _export_form(name, peft)]
        raise errors.UserError(f"{workdir} fine-tuned a {task.kind!r} head, which has no "
                               f"{'peft task type here' if peft else 'transformers class'}: exportable are "
                               f"{', '.join(exportable)}" + (" (with --peft)" if peft else ""))
    return task, task_heads.head_kind(task.kind)


def _export_form(kind: str, peft: bool) -> str | None:
    """A head kind's transformers class, or with `peft` its peft task type; None where it has none."""
    head = task_heads.head_kind(kind)
    return head.peft_task_type if peft else head.hf_class


def _peft_form(workdir: str, method: str, peft: bool) -> PeftExport:
    """The PEFT method's export form; one line where it has none for `peft`, before any weight is read."""
    form = PEFT_EXPORTS.get(method)
    if (form.unmerged if peft else form.merge is not None):
        return form
    raise errors.UserError(form.refused.format(workdir=workdir, method=method))


def with_base(config: ml_collections.ConfigDict, task: Task, workdir: str,
              step: int | None) -> tuple[dict, str | None, int]:
    """A PEFT checkpoint's trained part over its base (checked by fingerprint) -> (the whole tree, the base's
    Hugging Face directory or None, the step). The model's shapes come from a dummy input rather than a GLUE
    split: an export needs no task data."""
    part, init, step = parameter_efficient.load_stored(workdir, step)
    finetuner = registry.for_config(config, task, tokenizer=None)  # only its model: no tokenizer needed
    ids = np.zeros((1, 8), np.int32)                              # [B, L]: any shape builds the same weights
    example = dict(input_ids=ids, segment_ids=ids, input_mask=ids)
    params = parameter_efficient.rebuild(finetuner.build_model(), example, part, init, finetuner.merge_pretrained)
    hf_base = init.source.removeprefix("huggingface:") if init.source.startswith("huggingface:") else None
    return params, hf_base, step


def _vocab(tokenizer: dict) -> tuple[str | None, bool]:
    """(the WordPiece vocab.txt or None with a note, lowercase)."""
    if tokenizer.get("kind") != "wordpiece":
        print(f"note: the SentencePiece tokenizer {tokenizer.get('path')} is not copied (transformers' BertTokenizer "
              "reads WordPiece vocab.txt files only)")
        return None, tokenizer.get("lowercase", True)
    path = tokenizer["path"]
    return (os.path.join(path, "vocab.txt") if os.path.isdir(path) else path), tokenizer.get("lowercase", True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--peft", action="store_true",
                        help="a LoRA / prefix / prompt run as an unmerged peft directory (default: LoRA merged)")
    args = parser.parse_args()
    with errors.one_line_errors():
        print(export(args.workdir, args.output, args.step, args.peft))
    return 0


if __name__ == "__main__":
    sys.exit(main())
