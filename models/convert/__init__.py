"""Checkpoint importers/exporters between this codebase and Hugging Face / original releases."""
from models.convert.hf_bert import bert_config_to_hf, bert_params_from_hf, hf_config_to_bert, hf_state_dict_from_bert
from models.convert.hf_io import load_hf_albert, load_hf_bert, save_hf_albert, save_hf_bert

__all__ = ["bert_config_to_hf", "bert_params_from_hf", "hf_config_to_bert", "hf_state_dict_from_bert",
           "load_hf_albert", "load_hf_bert", "save_hf_albert", "save_hf_bert"]
