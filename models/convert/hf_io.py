"""Read and write Hugging Face BERT and ALBERT directories (config.json + model.safetensors [+ vocab.txt or
ALBERT's spiece.model]); the readers and the atomic writer the other families' converters share.

Reading needs no torch for safetensors; a legacy pytorch_model.bin is read with torch only if it is
installed. Exports are written to a temporary directory and renamed into place, so an interrupted
export never leaves a directory that looks complete but is not.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Mapping

import numpy as np

from models.bert import BertConfig
from models.convert.hf_albert import (albert_config_to_hf, albert_params_from_hf, hf_config_to_albert,
                                      hf_state_dict_from_albert)
from models.convert.hf_bert import bert_config_to_hf, bert_params_from_hf, hf_config_to_bert, hf_state_dict_from_bert
from models.errors import ModelInputError

SAFETENSORS, PYTORCH_BIN, CONFIG, VOCAB, TOKENIZER_CONFIG = (
    "model.safetensors", "pytorch_model.bin", "config.json", "vocab.txt", "tokenizer_config.json")
SPIECE = "spiece.model"  # T5's and ALBERT's SentencePiece model
TOKENIZER_JSON = "tokenizer.json"  # a Hugging Face tokenizers pipeline (ModernBERT's)
_EXPORT_FILES = {SAFETENSORS, CONFIG, VOCAB, TOKENIZER_CONFIG, SPIECE, TOKENIZER_JSON}


def _float32(array: np.ndarray) -> np.ndarray:
    """Floats of any width (float16, bfloat16, float64) -> float32; integer buffers stay as they are."""
    return array if np.issubdtype(array.dtype, np.integer) or array.dtype == bool else array.astype(np.float32)


def read_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
    """(name -> numpy array with floats as float32, the file read)."""
    path = os.path.join(directory, SAFETENSORS)
    if os.path.isfile(path):
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so bf16 checkpoints read too)
        import safetensors
        import safetensors.numpy
        try:
            return {k: _float32(v) for k, v in safetensors.numpy.load_file(path).items()}, path
        except (safetensors.SafetensorError, OSError) as e:
            raise ModelInputError(f"cannot read {path}: {e} (re-export or re-download the checkpoint)") from None
    path = os.path.join(directory, PYTORCH_BIN)
    if os.path.isfile(path):
        try:
            import torch
        except ImportError:
            raise ModelInputError(f"reading {path} needs torch (pip install torch, or convert the checkpoint to "
                                  f"{SAFETENSORS})") from None
        try:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as e:  # bad zip, bad pickle, not weights
            raise ModelInputError(f"cannot read {path}: {str(e).splitlines()[0]} "
                                  f"(re-export it as {SAFETENSORS})") from None
        return {k: _float32(v.float().numpy() if v.is_floating_point() else v.numpy())
                for k, v in state_dict.items()}, path
    raise ModelInputError(f"no weights in {directory}: expected {SAFETENSORS} or {PYTORCH_BIN} (save the model with "
                          "save_pretrained, or give the directory that holds them)")


def read_hf_config(directory: str, model_type: str, family: str) -> tuple[dict, str]:
    """directory/config.json of a `model_type` checkpoint -> (the dict, its path); one-line errors."""
    config_path = os.path.join(directory, CONFIG)
    if not os.path.isfile(config_path):
        raise ModelInputError(f"{config_path} not found (give a Hugging Face {family} directory with {CONFIG} and "
                              f"{SAFETENSORS}, as save_pretrained writes)")
    try:
        with open(config_path) as f:
            hf_config = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelInputError(f"cannot read {config_path}: {e} (it must be a JSON object)") from None
    found = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if found != model_type:
        raise ModelInputError(f"{config_path}: model_type={found!r}, only {model_type!r} checkpoints can be "
                              "loaded here")
    return hf_config, config_path


def load_hf_bert(directory: str) -> tuple[BertConfig, dict]:
    """A Hugging Face BERT directory -> (BertConfig, our params as numpy arrays).

    Accepts BertModel naming and 'bert.'-prefixed naming (BertForPreTraining / MaskedLM /
    SequenceClassification; task heads other than cls.* are ignored). The result has 'bert' and,
    only when the checkpoint has them, 'mlm_head' and 'nsp_head'; config.next_sentence says which.
    """
    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        raise ModelInputError(f"Hugging Face checkpoint directory not found: {directory} (give a directory with "
                              f"{CONFIG} and {SAFETENSORS})")
    config_path = os.path.join(directory, CONFIG)
    if not os.path.isfile(config_path):
        raise ModelInputError(f"{config_path} not found (a Hugging Face checkpoint directory has {CONFIG} next to its "
                              "weights; save it with save_pretrained)")
    try:
        with open(config_path) as f:
            hf_config = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelInputError(f"cannot read {config_path}: {e} (it must be a JSON object)") from None
    if not isinstance(hf_config, dict) or hf_config.get("model_type", "bert") != "bert":
        model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
        raise ModelInputError(f"{config_path}: model_type={model_type!r}, only 'bert' checkpoints can be loaded "
                              "(give a BERT checkpoint)")
    state_dict, weights_path = read_weights(directory)
    config = hf_config_to_bert(hf_config, next_sentence="cls.seq_relationship.weight" in state_dict,
                               source=config_path)
    return config, bert_params_from_hf(state_dict, config, source=weights_path)


def save_hf_bert(directory: str, params: dict, config: BertConfig, *, vocab_file: str | None = None,
                 lowercase: bool = True) -> None:
    """Export our params as a directory transformers' from_pretrained loads.

    The architecture follows the heads present: MLM + NSP -> BertForPreTraining, MLM only ->
    BertForMaskedLM, none -> BertModel (unprefixed names). An existing directory is replaced only if
    it holds nothing but files an export writes; anything else is refused, never deleted.
    """
    directory = check_export_target(directory)
    tokenizer_files = bert_tokenizer_files(vocab_file, lowercase, config)
    architecture = ("BertModel" if "mlm_head" not in params
                    else "BertForPreTraining" if "nsp_head" in params else "BertForMaskedLM")
    state_dict = hf_state_dict_from_bert(params, config, prefix="" if architecture == "BertModel" else "bert.")
    write_export(directory, bert_config_to_hf(config, architecture), state_dict, tokenizer_files)


def load_hf_albert(directory: str) -> tuple[BertConfig, dict]:
    """A Hugging Face ALBERT directory (AlbertModel, or 'albert.'-prefixed naming with predictions.* and
    sop_classifier.*) -> (BertConfig with shared_layers, our params as numpy arrays). The result has 'bert' and,
    only when the checkpoint has them, 'mlm_head' and 'nsp_head' (the SOP head); config.next_sentence says which."""
    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        raise ModelInputError(f"Hugging Face checkpoint directory not found: {directory} (give a directory with "
                              f"{CONFIG} and {SAFETENSORS})")
    hf_config, config_path = read_hf_config(directory, "albert", "ALBERT")
    state_dict, weights_path = read_weights(directory)
    has_sop = any(k.removeprefix("albert.") == "sop_classifier.classifier.weight" for k in state_dict)
    config = hf_config_to_albert(hf_config, next_sentence=has_sop, source=config_path)
    return config, albert_params_from_hf(state_dict, config, source=weights_path)


def save_hf_albert(directory: str, params: dict, config: BertConfig, *, spiece_file: str | None = None,
                   lowercase: bool = True) -> None:
    """Export a shared_layers model as ALBERT: MLM + SOP heads -> AlbertForPreTraining, MLM only ->
    AlbertForMaskedLM, none -> AlbertModel (unprefixed names). spiece_file: the SentencePiece model, copied
    as spiece.model with a tokenizer_config.json (do_lower_case = lowercase). The target is checked as
    save_hf_bert checks it."""
    directory = check_export_target(directory)
    if spiece_file is not None and not os.path.isfile(os.path.expanduser(spiece_file)):
        raise ModelInputError(f"SentencePiece model not found: {spiece_file} (give the .model file the model was "
                              "trained with)")
    architecture = ("AlbertModel" if "mlm_head" not in params
                    else "AlbertForPreTraining" if "nsp_head" in params else "AlbertForMaskedLM")
    state_dict = hf_state_dict_from_albert(params, config, prefix="" if architecture == "AlbertModel" else "albert.")

    def tokenizer_files(tmp: str) -> None:
        if spiece_file is not None:
            shutil.copyfile(os.path.expanduser(spiece_file), os.path.join(tmp, SPIECE))
            with open(os.path.join(tmp, TOKENIZER_CONFIG), "w") as f:
                json.dump({"do_lower_case": lowercase, "keep_accents": False, "tokenizer_class": "AlbertTokenizer",
                           "model_max_length": config.max_position_embeddings}, f, indent=2)
    write_export(directory, albert_config_to_hf(config, architecture), state_dict, tokenizer_files)


def bert_tokenizer_files(vocab_file: str | None, lowercase: bool, config: BertConfig) -> Callable[[str], None]:
    """The vocab.txt (checked: it exists, and fits the model's vocabulary) -> a writer of it and its
    tokenizer_config.json into an export's directory (nothing without a vocab file)."""
    if vocab_file is not None:
        vocab_file = _existing_file(vocab_file, VOCAB, "vocab file not found: {} (give the BERT vocab.txt the model "
                                                       "was trained with)")
        with open(vocab_file, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > config.vocab_size:
            raise ModelInputError(f"{vocab_file} has {lines} tokens but the model's vocab_size is {config.vocab_size} "
                                  "(give the vocab the model was trained with)")

    def tokenizer_files(tmp: str) -> None:
        if vocab_file is not None:
            shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB))
            with open(os.path.join(tmp, TOKENIZER_CONFIG), "w") as f:
                json.dump({"do_lower_case": lowercase, "tokenizer_class": "BertTokenizer",
                           "model_max_length": config.max_position_embeddings}, f, indent=2)
    return tokenizer_files


def check_export_target(directory: str) -> str:
    """The absolute export path; refused (never deleted) unless new or a previous export."""
    directory = os.path.abspath(os.path.expanduser(directory))
    if os.path.lexists(directory) and (not os.path.isdir(directory) or set(os.listdir(directory)) - _EXPORT_FILES):
        raise ModelInputError(f"{directory} exists and is not a previous export (export to a new directory or "
                              "remove it)")
    return directory


def write_export(directory: str, hf_config: dict, state_dict: dict[str, np.ndarray],
                 extra_files: Callable[[str], None] | None = None) -> None:
    """config.json + model.safetensors (+ what extra_files(tmp_dir) writes), renamed into place at the end."""
    import safetensors.numpy

    def fill(tmp: str) -> None:
        with open(os.path.join(tmp, CONFIG), "w") as f:
            json.dump(hf_config, f, indent=2)
        safetensors.numpy.save_file(state_dict, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        if extra_files is not None:
            extra_files(tmp)
    replace_directory(directory, fill)


def replace_directory(directory: str, fill: Callable[[str], None]) -> None:
    """fill(a temporary directory beside `directory`), then renamed into place: an interrupted export never
    leaves a directory that looks complete. A previous export (checked by the caller) is swapped, then deleted."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; an export is meant to be shared
        fill(tmp)
        _readable_as_written(tmp)
        if os.path.isdir(directory):
            old = tmp + ".old"
            os.rename(directory, old)
            os.rename(tmp, directory)
            shutil.rmtree(old)
        else:
            os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def tokenizer_json_writer(tokenizer_file: str, vocab_size: int, model_max_length: int,
                          special_tokens: Mapping[str, str]) -> tuple[Callable[[str], None], dict[str, int]]:
    """A tokenizer.json (or a directory with one), checked to read and to fit the model's vocabulary -> (a writer of
    it and a tokenizer_config.json naming `special_tokens` (tokenizer_config.json's names: eos_token, ...) that the
    file holds, for AutoTokenizer; those tokens' ids by name)."""
    tokenizer_file = _existing_file(tokenizer_file, TOKENIZER_JSON, "tokenizer not found: {} (give the tokenizer.json "
                                                                    "the model was trained with)")
    from tokenizers import Tokenizer as HFTokenizer
    try:
        tok = HFTokenizer.from_file(tokenizer_file)
    except Exception as e:  # noqa: BLE001 - the Rust parser raises a bare Exception
        raise ModelInputError(f"cannot read the tokenizer {tokenizer_file}: {str(e).splitlines()[0]} (give the "
                              "tokenizer.json the model was trained with)") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ModelInputError(f"{tokenizer_file} has {size} tokens but the model's vocab_size is {vocab_size} "
                              "(give the tokenizer the model was trained with)")
    present = {key: token for key, token in special_tokens.items() if tok.token_to_id(token) is not None}

    def write(tmp: str) -> None:
        shutil.copyfile(tokenizer_file, os.path.join(tmp, TOKENIZER_JSON))
        with open(os.path.join(tmp, TOKENIZER_CONFIG), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **present, "model_max_length": model_max_length,
                       "model_input_names": ["input_ids", "attention_mask"]}, f, indent=2)
    return write, {key: tok.token_to_id(token) for key, token in present.items()}


def _existing_file(path: str, name: str, missing: str) -> str:
    """A file, or a directory holding `name` -> the file's path; ModelInputError(missing.format(path)) if absent."""
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        path = os.path.join(path, name)
    if not os.path.isfile(path):
        raise ModelInputError(missing.format(path))
    return path


def _readable_as_written(directory: str) -> None:
    """Every file in `directory` gets the mode a file opened for writing gets here (0644 under umask 022): safetensors
    writes its file 0600, which the group that reads the rest of the workdir could not read."""
    probe = os.path.join(directory, ".mode")
    with open(probe, "w"):
        pass
    mode = os.stat(probe).st_mode & 0o777
    os.remove(probe)
    for name in os.listdir(directory):
        if os.path.isfile(os.path.join(directory, name)):
            os.chmod(os.path.join(directory, name), mode)
