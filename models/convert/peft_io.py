"""A fine-tuned BERT classifier of ours as Hugging Face directories transformers and peft load.

- `save_hf_bert_classifier`: a plain BertForSequenceClassification directory (encoder, pooler and the task
  head `classifier`), for full fine-tuning or a LoRA run merged into its base (models.peft.merge_lora);
  BertForTokenClassification (`classifier` at every position) and BertForQuestionAnswering (`qa_outputs`)
  for the tagging and QA heads.
- `save_peft_bert`: an unmerged peft directory (adapter_config.json + adapter_model.safetensors) of a LoRA,
  prefix-tuning or prompt-tuning run, for `PeftModel.from_pretrained(BertForSequenceClassification.
  from_pretrained(BASE, num_labels=C), DIR)`. The head travels as peft's `modules_to_save`.

peft's names (peft 0.21): the adapter name is left out of the file; LoRA tensors sit under
`base_model.model.<module>.lora_A.weight` [r, in] and `lora_B.weight` [out, r] (torch Linear layout), the head
under `base_model.model.classifier.*`; prompt learning saves `prompt_embeddings` and the head under
`base_model.classifier.*`. Prefix-tuning saves the key/value table [P, 2 * L * D] itself (the projected one
when trained through an MLP): slot 2l is layer l's keys, 2l + 1 its values, each head-major.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import flax.core.meta
import jax.numpy as jnp
import numpy as np

from models import peft
from models.bert import BertConfig
from models.convert.hf_bert import bert_config_to_hf, hf_state_dict_from_bert
from models.convert.hf_io import bert_tokenizer_files, check_export_target, replace_directory, write_export
from models.errors import ModelInputError
from models.qkv_layout import hf_layout
from models.registry import Registry

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# our LoRA target -> (its path in a BERT layer of ours, the Hugging Face module in encoder.layer.{i})
LORA_MODULES = {"query": (("attention", "query"), "attention.self.query"),
                "key": (("attention", "key"), "attention.self.key"),
                "value": (("attention", "value"), "attention.self.value"),
                "out": (("attention", "out"), "attention.output.dense"),
                "intermediate": (("mlp", "intermediate"), "intermediate.dense"),
                "output": (("mlp", "output"), "output.dense")}


def classifier_tensors(head: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """Our head {'classifier': {kernel [D, C], bias [C]}} -> HF `classifier.weight` [C, D] and `.bias` [C]."""
    classifier = head["classifier"]
    return {f"{prefix}classifier.weight": np.ascontiguousarray(np.asarray(classifier["kernel"], np.float32).T),
            f"{prefix}classifier.bias": np.asarray(classifier["bias"], np.float32)}


def classification_config(config: BertConfig, labels: tuple[str, ...],
                          architecture: str = "BertForSequenceClassification") -> dict:
    """config.json of a BertFor{Sequence,Token}Classification; `labels` names the classes (tags), () = one
    regression output."""
    names = list(labels) or ["LABEL_0"]
    return {**bert_config_to_hf(config, architecture),
            "id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)},
            **({} if labels else {"problem_type": "regression"})}


# The transformers classes a fine-tuned BERT exports as (a head kind names its own: objectives/task_heads/).
ARCHITECTURES = ("BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering")


def save_hf_bert_classifier(directory: str, params: dict, config: BertConfig, labels: tuple[str, ...], *,
                            architecture: str = "BertForSequenceClassification", vocab_file: str | None = None,
                            lowercase: bool = True) -> None:
    """params {'bert' (with its pooler), 'head'} of a plain BERT (LoRA merged) -> a directory that the
    transformers class `architecture` (one of ARCHITECTURES) loads whole, head included. Token classification
    and QA have no pooler there, so it is left out."""
    if peft.is_peft_path(_keys(params)):
        raise ModelInputError("the parameters still hold PEFT weights: merge LoRA (models.peft.merge_lora) or "
                              "export them with save_peft_bert")
    if architecture not in ARCHITECTURES:
        raise ModelInputError(f"{architecture!r} is no BERT task class this exports; use one of "
                              f"{', '.join(ARCHITECTURES)}")
    directory = check_export_target(directory)
    state_dict = hf_state_dict_from_bert({"bert": params["bert"]}, config)
    if architecture != "BertForSequenceClassification":
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("bert.pooler.")}
    if architecture == "BertForQuestionAnswering":
        outputs = params["head"]["qa_outputs"]
        state_dict["qa_outputs.weight"] = np.ascontiguousarray(np.asarray(outputs["kernel"], np.float32).T)
        state_dict["qa_outputs.bias"] = np.asarray(outputs["bias"], np.float32)
        hf_config = bert_config_to_hf(config, architecture)
    else:
        state_dict.update(classifier_tensors(params["head"]))
        hf_config = classification_config(config, labels, architecture)

    tokenizer_files = bert_tokenizer_files(vocab_file, lowercase, config)
    write_export(directory, hf_config, state_dict, tokenizer_files)


def _keys(tree) -> list[str]:
    """Every dict key anywhere in `tree`."""
    if not isinstance(tree, dict):
        return []
    return [k for key, value in tree.items() for k in (key, *_keys(value))]


# ---------------------------------------------------------------------------------------------
# peft directories
# ---------------------------------------------------------------------------------------------
def save_peft_bert(directory: str, params: dict, config: BertConfig, spec: peft.PeftConfig, *,
                   base: str | None = None) -> None:
    """params {'bert' (base + PEFT weights), 'head'} of a LoRA / prefix / prompt run (`spec`) -> a peft directory.

    `base` (a Hugging Face directory) goes into base_model_name_or_path, which AutoPeftModel* loads;
    PeftModel.from_pretrained takes the base model itself and ignores it."""
    form = PEFT_FORMATS.get(spec.method)
    params = hf_layout(flax.core.meta.unbox(params))  # a scanned run's stacked layers: one per HF layer
    tensors, adapter_config = form.write(params["bert"], config, spec)
    tensors.update(classifier_tensors(params["head"], form.head_prefix))
    adapter_config.update(task_type="SEQ_CLS", modules_to_save=["classifier"], inference_mode=True,
                          base_model_name_or_path=base)
    _write_peft(_peft_target(directory), adapter_config, tensors)


@dataclasses.dataclass(frozen=True)
class PeftFormat:
    """A PEFT method's form in the peft library's directories."""
    # (params['bert'], config, spec) -> (tensors, adapter_config.json's settings)
    write: Callable[[dict, BertConfig, peft.PeftConfig], tuple[dict, dict]]
    head_prefix: str  # where the classifier's tensors go: LoRA wraps the model (.model), prompt learning does not


# peft.method -> its peft library format; the methods the library lacks (adapters) have none
PEFT_FORMATS: Registry[PeftFormat] = Registry("PEFT method with a peft library format", key="peft.method",
                                              error=ModelInputError)


def _lora(bert: dict, config: BertConfig, spec: peft.PeftConfig) -> tuple[dict, dict]:
    """Each targeted projection's A [*in, r] -> lora_A.weight [r, in], B [r, *out] -> lora_B.weight [out, r]."""
    tensors = {}
    for i in range(config.num_layers):
        for target in spec.lora_targets:
            ours, hf = LORA_MODULES[target]
            node = bert[f"layer_{i}"]
            for name in ours:
                node = node[name]
            a, b = np.asarray(node["lora_a"], np.float32), np.asarray(node["lora_b"], np.float32)
            name = f"base_model.model.bert.encoder.layer.{i}.{hf}"
            tensors[f"{name}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, spec.lora_rank).T)
            tensors[f"{name}.lora_B.weight"] = np.ascontiguousarray(b.reshape(spec.lora_rank, -1).T)
    # A regular expression over whole module names: a suffix list would let `output.dense` (the FFN's)
    # match `attention.output.dense` too.
    modules = "|".join(LORA_MODULES[t][1].replace(".", r"\.") for t in spec.lora_targets)
    return tensors, {"peft_type": "LORA", "r": spec.lora_rank, "lora_alpha": spec.lora_alpha,
                     "lora_dropout": spec.lora_dropout, "bias": "none", "use_rslora": False,
                     "target_modules": rf"bert\.encoder\.layer\.\d+\.({modules})"}


def _prompt_learning(config: BertConfig, peft_type: str, length: int) -> dict:
    return {"peft_type": peft_type, "num_virtual_tokens": length, "token_dim": config.hidden_size,
            "num_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "num_transformer_submodules": 1}


def _prefix(bert: dict, config: BertConfig, spec: peft.PeftConfig) -> tuple[dict, dict]:
    """The prefix our PrefixEncoder computes, [L, 2, P, H, K] -> peft's table [P, 2 * L * D] (what peft saves,
    the MLP's output included), so peft loads it without a projection."""
    encoder = peft.PrefixEncoder(spec.prefix_length, config.num_layers, config.num_heads,
                                 config.hidden_size // config.num_heads, config.hidden_size, spec.prefix_hidden_size)
    prefix = encoder.apply({"params": bert["prefix_encoder"]})                     # [L, 2, P, H, K]
    table = jnp.transpose(prefix, (2, 0, 1, 3, 4)).reshape(spec.prefix_length, -1)  # [P, (L, 2, H, K)]
    settings = _prompt_learning(config, "PREFIX_TUNING", spec.prefix_length)
    settings.update(prefix_projection=False, encoder_hidden_size=config.hidden_size)
    return {"prompt_embeddings": np.asarray(table, np.float32)}, settings


def _prompt(bert: dict, config: BertConfig, spec: peft.PeftConfig) -> tuple[dict, dict]:
    """Prompt tuning's embeddings [P, D] as they are."""
    settings = _prompt_learning(config, "PROMPT_TUNING", spec.prompt_length)
    settings.update(prompt_tuning_init="RANDOM")  # only used to initialize; loading reads the saved table
    return {"prompt_embeddings": np.asarray(bert["prompt"]["embedding"], np.float32)}, settings


def _peft_target(directory: str) -> str:
    """The absolute path; refused (never deleted) unless new or a previous peft export."""
    directory = os.path.abspath(os.path.expanduser(directory))
    ours = {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
    if os.path.lexists(directory) and (not os.path.isdir(directory) or set(os.listdir(directory)) - ours):
        raise ModelInputError(f"{directory} exists and is not a previous peft export (export to a new directory "
                              "or remove it)")
    return directory


def _write_peft(directory: str, adapter_config: dict, tensors: dict[str, np.ndarray]) -> None:
    import safetensors.numpy

    def fill(tmp: str) -> None:
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w") as f:
            json.dump(adapter_config, f, indent=2)
        safetensors.numpy.save_file(tensors, os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    replace_directory(directory, fill)


PEFT_FORMATS.register("lora", PeftFormat(_lora, head_prefix="base_model.model."))
PEFT_FORMATS.register("prefix", PeftFormat(_prefix, head_prefix="base_model."))
PEFT_FORMATS.register("prompt", PeftFormat(_prompt, head_prefix="base_model."))
