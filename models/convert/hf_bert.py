"""Hugging Face BERT weights (BertForPreTraining or BertModel naming) -> our BERT parameters.

torch Linear weights are [out, in]; our kernels are [in, ...out] with attention projections split
per head: query/key/value [D, H, K] and the output projection [H, K, D].
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from models.bert import BertConfig


def bert_params_from_hf(state_dict: Mapping[str, np.ndarray], config: BertConfig) -> dict:
    """state_dict: name -> numpy array (e.g. {k: v.numpy() for k, v in model.state_dict().items()}).

    Returns the `params` collection of models.bert.BertForPreTraining. Heads absent from a
    BertModel checkpoint are left out (the caller keeps freshly initialised ones).
    """
    sd = {k.removeprefix("bert."): np.asarray(v) for k, v in state_dict.items()}
    heads, head_dim = config.num_heads, config.hidden_size // config.num_heads

    def linear(name: str) -> dict:
        return {"kernel": sd[f"{name}.weight"].T, "bias": sd[f"{name}.bias"]}

    def norm(name: str) -> dict:
        return {"scale": sd[f"{name}.weight"], "bias": sd[f"{name}.bias"]}

    def attention_in(name: str) -> dict:  # [H*K, D] -> [D, H, K]
        w, b = sd[f"{name}.weight"], sd[f"{name}.bias"]
        return {"kernel": w.T.reshape(-1, heads, head_dim), "bias": b.reshape(heads, head_dim)}

    e = "embeddings"
    bert = {"embeddings": {
        "word_embeddings": {"embedding": sd[f"{e}.word_embeddings.weight"]},
        "position_embeddings": {"embedding": sd[f"{e}.position_embeddings.weight"]},
        "token_type_embeddings": {"embedding": sd[f"{e}.token_type_embeddings.weight"]},
        "norm": norm(f"{e}.LayerNorm")}}
    for i in range(config.num_layers):
        p = f"encoder.layer.{i}"
        out = sd[f"{p}.attention.output.dense.weight"]  # [D, H*K] -> [H, K, D]
        bert[f"layer_{i}"] = {
            "attention": {
                "query": attention_in(f"{p}.attention.self.query"),
                "key": attention_in(f"{p}.attention.self.key"),
                "value": attention_in(f"{p}.attention.self.value"),
                "out": {"kernel": out.T.reshape(heads, head_dim, -1), "bias": sd[f"{p}.attention.output.dense.bias"]}},
            "attention_norm": norm(f"{p}.attention.output.LayerNorm"),
            "mlp": {"intermediate": linear(f"{p}.intermediate.dense"), "output": linear(f"{p}.output.dense")},
            "output_norm": norm(f"{p}.output.LayerNorm")}
    if "pooler.dense.weight" in sd:
        bert["pooler"] = linear("pooler.dense")
    params = {"bert": bert}
    if "cls.predictions.transform.dense.weight" in sd:
        params["mlm_head"] = {"transform": linear("cls.predictions.transform.dense"),
                              "transform_norm": norm("cls.predictions.transform.LayerNorm"),
                              "bias": sd["cls.predictions.bias"]}
    if config.next_sentence and "cls.seq_relationship.weight" in sd:
        params["nsp_head"] = {"classifier": linear("cls.seq_relationship")}
    return params
