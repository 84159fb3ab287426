"""models/peft.py against Hugging Face peft 0.21.2: LoRA, prefix-tuning and prompt tuning on BERT, GPT-2 and T5.

Two things are compared, on tiny random models (float32, dropout off):

1. Trainable-parameter counts. Ours: every parameter whose path `is_peft_path` accepts, plus the task head
   (BERT `head`, GPT `score`; T5 has none), from `jax.eval_shape` of `model.init`. peft's: the numel of every
   `requires_grad` parameter of `get_peft_model(...)` on BertForSequenceClassification / GPT2ForSequenceClassification
   (task SEQ_CLS, which also trains a copy of the head) and T5ForConditionalGeneration (SEQ_2_SEQ_LM). Same
   settings on both sides; LoRA takes both libraries' defaults (r=8, alpha=8, query and value; GPT-2's fused
   c_attn in peft).
2. Forward passes. The HF base weights go through this repo's converters (models/convert/hf_*.py); random
   PEFT weights (LoRA B nonzero) are copied between the two, and the logits must agree within 1e-4. Each
   case also checks that the PEFT weights move the logits well beyond that, so that a method silently
   left out would fail.

peft's layouts and quirks that the mapping follows (see peft's source; all verified here numerically):
- LoRA: lora_A.weight is [r, in] and lora_B.weight [out, r] (torch Linear layout, even for GPT-2's Conv1D);
  ours are lora_a [in, r] and lora_b [r, H, K]. GPT-2 has one fused c_attn, so our query+value LoRA of rank r
  is peft's c_attn LoRA of rank 2r with A' = [A_q; A_v] and a block-structured B' (zero rows for the keys).
- Prefix-tuning: the flat [P, L * 2 * H * K] table is ordered (layer, key/value, head, head dim) on both
  sides. BERT and GPT-2 number the tokens from P (the prefix is "past"). T5 gets the prefix in the decoder's
  self-attention only, and peft's cat + split(4) of the slots sends decoder layer i to prefix block
  2i mod L (with L = 3 that is a permutation, so every block is used).
- Prompt tuning: P embeddings before the tokens, at positions 0..P-1 (BERT pools the first virtual token;
  peft's GPT-2 classifier pools the last position, so its batch has no padding). T5 uses the prompt in the
  encoder only; peft's default num_transformer_submodules=2 allocates P more rows nothing reads, so the
  count compares against num_transformer_submodules=1.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model

from tests.helpers.peft_reference import (
    ALPHA, HEADS, HEAD_DIM, METHODS, RANK, T5_LAYERS, WIDTH, assert_close, assert_complete, bert_batch, copy_lora,
    copy_prefix_or_prompt, gpt2_batch, hf_bert, hf_gpt2, hf_t5, our_trainable_count, ours_bert, ours_gpt2,
    ours_t5, peft_configs, peft_trainable_count, put, run_ours, t, t5_batch, torch_ints,
    logits, with_random_peft)


# ---------------------------------------------------------------------------------------------
# 1. Trainable-parameter counts
# ---------------------------------------------------------------------------------------------
# family -> (the HF model, ours from it, peft's task type, a batch, our task head's name)
COUNTED = {"bert": (hf_bert, ours_bert, TaskType.SEQ_CLS, bert_batch, "head"),
           "gpt2": (hf_gpt2, ours_gpt2, TaskType.SEQ_CLS, lambda: gpt2_batch(padding=True), "score"),
           "t5": (hf_t5, ours_t5, TaskType.SEQ_2_SEQ_LM, t5_batch, None)}


@pytest.mark.parametrize("family", COUNTED)
@pytest.mark.parametrize("method", METHODS)
def test_trainable_parameters_match_peft(family, method):
    # GPT-2's LoRA: peft's default target is the fused c_attn [D -> 3D] at rank 8, r (D + 3D) per layer; ours is
    # query and value at rank 8, 2 r (D + D) per layer: both 4 r D L (a different structure, the same count).
    hf_model, ours_model, task, batch, head = COUNTED[family]
    theirs, ours = peft_configs(method, task)
    hf = hf_model()
    model, _ = ours_model(hf, ours)
    expected = peft_trainable_count(get_peft_model(hf, theirs))
    assert our_trainable_count(model, batch(), head=head) == expected


# ---------------------------------------------------------------------------------------------
# 2. Forward passes with the same weights
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_bert_logits_match_peft(method):
    theirs, ours = peft_configs(method, TaskType.SEQ_CLS, rank=RANK, alpha=ALPHA)
    hf = hf_bert()
    model, params = ours_bert(hf, ours)
    ids, segments, mask = bert_batch()
    inputs = dict(zip(("input_ids", "token_type_ids", "attention_mask"), torch_ints(ids, segments, mask)))
    base, peft_model = with_random_peft(hf, theirs, inputs)
    expected = logits(peft_model, inputs)
    if method == "lora":
        for i, layer in enumerate(peft_model.base_model.model.bert.encoder.layer):
            for name in ("query", "value"):
                copy_lora(params, ("bert", f"layer_{i}", "attention", name), getattr(layer.attention.self, name))
    else:
        copy_prefix_or_prompt(params, ("bert",), peft_model)
    head = peft_model.get_base_model().classifier.modules_to_save["default"]  # the trained copy peft runs
    put(params, ("head", "classifier", "kernel"), t(head.weight).T)
    put(params, ("head", "classifier", "bias"), t(head.bias))
    assert_complete(model, params, (ids, segments, mask))
    assert_close(run_ours(model, params, ids, segments, mask), expected, base)


@pytest.mark.parametrize("method", METHODS)
def test_gpt2_logits_match_peft(method):
    theirs, ours = peft_configs(method, TaskType.SEQ_CLS, rank=RANK, alpha=ALPHA)
    if method == "lora":  # one c_attn LoRA of rank 2r stands for our query + value pair; alpha' / 2r = alpha / r
        theirs = LoraConfig(task_type=TaskType.SEQ_CLS, r=2 * RANK, lora_alpha=2 * ALPHA)
    hf = hf_gpt2()
    model, params = ours_gpt2(hf, ours)
    # peft's prompt tuning hands GPT-2 embeddings, not ids, so its classifier cannot find the padding and pools
    # the last position: that batch has none. The other methods keep the ids, and padding.
    ids, mask = gpt2_batch(padding=method != "prompt")
    inputs = dict(zip(("input_ids", "attention_mask"), torch_ints(ids, mask)))
    base, peft_model = with_random_peft(hf, theirs, inputs)
    if method == "lora":
        rng = np.random.default_rng(1)
        d, r = WIDTH, RANK
        a = {name: rng.standard_normal((d, r)) / math.sqrt(d) for name in ("query", "value")}   # ours [D, r]
        b = {name: rng.standard_normal((r, d)) / math.sqrt(r) for name in ("query", "value")}   # ours [r, H*K]
        fused_a = np.concatenate([a["query"].T, a["value"].T])       # [2r, D]: rank rows r..2r-1 serve the values
        fused_b = np.zeros((3 * d, 2 * r))                           # [3D, 2r]: c_attn's output is (q, k, v)
        fused_b[:d, :r], fused_b[2 * d:, r:] = b["query"].T, b["value"].T
        for i, block in enumerate(peft_model.base_model.model.transformer.h):
            with torch.no_grad():
                block.attn.c_attn.lora_A["default"].weight.copy_(torch.from_numpy(fused_a.astype(np.float32)))
                block.attn.c_attn.lora_B["default"].weight.copy_(torch.from_numpy(fused_b.astype(np.float32)))
            for name in ("query", "value"):
                put(params, ("gpt", f"layer_{i}", "attention", name, "lora_a"), a[name])
                put(params, ("gpt", f"layer_{i}", "attention", name, "lora_b"), b[name].reshape(r, HEADS, HEAD_DIM))
    else:
        copy_prefix_or_prompt(params, ("gpt",), peft_model)
    put(params, ("score", "kernel"), t(peft_model.get_base_model().score.modules_to_save["default"].weight).T)
    expected = logits(peft_model, inputs)
    assert_complete(model, params, (ids, mask))
    assert_close(run_ours(model, params, ids, mask), expected, base)


def t5_prefix_columns(num_layers: int) -> np.ndarray:
    """Our flat prefix columns as indices into peft's: peft's cat([kv, kv]) + split(4) of the 2L key/value
    slots gives decoder layer i the slots 4i, 4i+1 (mod 2L), i.e. the block of layer 2i mod L."""
    block = 2 * WIDTH  # a layer's keys and values: H * K = D each
    return np.concatenate([np.arange(block) + (2 * i % num_layers) * block for i in range(num_layers)])


def test_t5_prefix_columns_are_a_permutation_for_three_layers():
    """With an even depth two decoder layers would share a block and the other half would be dead."""
    assert sorted(t5_prefix_columns(T5_LAYERS)) == list(range(T5_LAYERS * 2 * WIDTH))
    assert t5_prefix_columns(T5_LAYERS)[2 * WIDTH] == 2 * 2 * WIDTH  # layer 1 reads block 2


@pytest.mark.parametrize("method", METHODS)
def test_t5_logits_match_peft(method):
    theirs, ours = peft_configs(method, TaskType.SEQ_2_SEQ_LM, rank=RANK, alpha=ALPHA)
    hf = hf_t5()
    model, params = ours_t5(hf, ours)
    encoder_ids, decoder_ids = t5_batch()
    inputs = dict(zip(("input_ids", "attention_mask", "decoder_input_ids"),
                      torch_ints(encoder_ids, encoder_ids != 0, decoder_ids)))
    base, peft_model = with_random_peft(hf, theirs, inputs)
    expected = logits(peft_model, inputs)
    if method == "lora":
        t5 = peft_model.base_model.model
        for i in range(T5_LAYERS):
            attentions = {("encoder", "self_attention"): t5.encoder.block[i].layer[0].SelfAttention,
                          ("decoder", "self_attention"): t5.decoder.block[i].layer[0].SelfAttention,
                          ("decoder", "cross_attention"): t5.decoder.block[i].layer[1].EncDecAttention}
            for (stack, attention), module in attentions.items():
                copy_lora(params, (stack, f"layer_{i}", attention, "query"), module.q)
                copy_lora(params, (stack, f"layer_{i}", attention, "value"), module.v)
    else:
        copy_prefix_or_prompt(params, (), peft_model, t5_prefix_columns(T5_LAYERS) if "prefix" in method else None)
    assert_complete(model, params, (encoder_ids, decoder_ids))
    assert_close(run_ours(model, params, encoder_ids, decoder_ids), expected, base)
