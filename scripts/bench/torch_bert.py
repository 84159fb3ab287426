"""Hugging Face `BertForPreTraining` on PyTorch, fed this project's batches: the peer of the pretraining benchmarks
(bench_pretrain.py: time per step; bench_cram.py: what a wall-clock budget buys).

The model takes the architecture of a configs/bert.py config and the optimizer of its config.optimizer (AdamW
with weight decay off for LayerNorm and biases, linear warm-up then linear decay, clipping), as the JAX side
has them; a batch is the dict this project's objectives build (objectives/nsp.py, objectives/mlm.py).
"""
from __future__ import annotations

import numpy as np
import torch
import transformers


def build_model(model_config, pad_id: int = 0, seed: int = 0) -> transformers.BertForPreTraining:
    torch.manual_seed(seed)
    m = model_config
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
        hidden_dropout_prob=m.dropout_rate, attention_probs_dropout_prob=m.attention_dropout_rate,
        layer_norm_eps=m.layer_norm_eps, initializer_range=m.initializer_range, pad_token_id=pad_id,
        attn_implementation="sdpa"))
    model.train()
    return model


def build_optimizer(model, optimizer_config, num_steps: int):
    """-> (AdamW, its linear warm-up/decay scheduler), as pretrain/training/optimizers.py builds them."""
    o = optimizer_config
    no_decay = [p for n, p in model.named_parameters() if "LayerNorm" in n or n.endswith("bias")]
    decay = [p for n, p in model.named_parameters() if not ("LayerNorm" in n or n.endswith("bias"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, o.warmup_steps, num_steps)


def inputs(batch: dict[str, np.ndarray], next_sentence: bool = True) -> dict[str, torch.Tensor]:
    """This project's batch -> BertForPreTraining's arguments (labels -100 where nothing is predicted)."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows, cols = np.nonzero(batch["masked_lm_weights"])
    labels[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
    out = dict(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
               token_type_ids=torch.from_numpy(batch["segment_ids"].astype(np.int64)),
               attention_mask=torch.from_numpy(batch["input_mask"].astype(np.int64)),
               labels=torch.from_numpy(labels))
    if next_sentence:
        out["next_sentence_label"] = torch.from_numpy(batch["next_sentence_labels"].astype(np.int64))
    return out


def loss_of(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """BertForPreTraining's loss: it computes one only when both labels are given, so MLM alone (no NSP, as
    RoBERTa) is its masked-LM cross-entropy, taken here from its logits as it does."""
    if "next_sentence_label" in batch:
        return model(**batch).loss
    out = model(**{k: v for k, v in batch.items() if k != "labels"})
    logits = out.prediction_logits
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), batch["labels"].view(-1),
                                             ignore_index=-100)


def train_step(model, optimizer, scheduler, batch: dict[str, torch.Tensor], clip_norm: float) -> float:
    """One update; -> its loss (MLM, plus NSP where the batch has its labels)."""
    loss = loss_of(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def evaluate(model, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Held-out MLM loss and accuracy over the masked positions (and NSP's where labelled), dropout off."""
    model.eval()
    totals = {"mlm_loss": 0.0, "mlm_accuracy": 0.0, "nsp_accuracy": 0.0}
    for batch in batches:
        out = model(**{k: v for k, v in batch.items() if k not in ("labels", "next_sentence_label")})
        masked = batch["labels"] != -100
        logits, targets = out.prediction_logits[masked], batch["labels"][masked]
        totals["mlm_loss"] += float(torch.nn.functional.cross_entropy(logits, targets)) / len(batches)
        totals["mlm_accuracy"] += float((logits.argmax(-1) == targets).float().mean()) / len(batches)
        if "next_sentence_label" in batch:
            right = out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]
            totals["nsp_accuracy"] += float(right.float().mean()) / len(batches)
    model.train()
    return totals if any("next_sentence_label" in b for b in batches) else {
        k: v for k, v in totals.items() if k != "nsp_accuracy"}
