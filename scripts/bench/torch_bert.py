"""Hugging Face `BertForPreTraining` and `ModernBertForMaskedLM` on PyTorch, fed this project's batches: the peers
of the pretraining benchmarks (bench_pretrain.py: time per step; bench_cram.py: what a wall-clock budget buys).

The model takes the architecture of a configs/bert.py or configs/modernbert.py config (configs/cram.py's arms) and
the optimizer of its config.optimizer (AdamW with weight decay off for norms and biases, the same learning rate at
every step as pretrain/training/optimizers.py computes it, clipping), as the JAX side has them; a batch is the dict
this project's objectives build (objectives/nsp.py, objectives/mlm.py). ModernBERT predicts the masked positions
only (`sparse_prediction`, as its authors train it and as ours does).
"""
from __future__ import annotations

import numpy as np
import torch
import transformers


def build_model(model_config, pad_id: int = 0, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    m = model_config
    if m.name == "modernbert":
        import models
        from models.convert import hf_modernbert
        fields = hf_modernbert.config_to_hf(models.model_config(m.to_dict()))
        model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
            **fields, pad_token_id=pad_id, sparse_prediction=True, attn_implementation="sdpa"))
    elif m.name == "bert" and not m.get("pre_norm", False):
        model = transformers.BertForPreTraining(transformers.BertConfig(
            vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
            max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
            hidden_dropout_prob=m.dropout_rate, attention_probs_dropout_prob=m.attention_dropout_rate,
            layer_norm_eps=m.layer_norm_eps, initializer_range=m.initializer_range, pad_token_id=pad_id,
            attn_implementation="sdpa"))
    else:
        raise ValueError(f"model {m.name!r} (pre_norm={m.get('pre_norm', False)}) has no transformers peer here: "
                         "BERT (post-LN) and ModernBERT have")
    model.train()
    return model


def build_optimizer(model, optimizer_config, num_steps: int):
    """-> (AdamW, a scheduler giving pretrain/training/optimizers.py's learning rate at every step): weight decay
    on matrices and embeddings only (norms and biases are the 1-D parameters), as weight_decay_mask."""
    import jax.numpy as jnp

    from pretrain.training import optimizers
    o = optimizer_config
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    rates = np.asarray(optimizers.learning_rate_schedule(o, num_steps)(jnp.arange(num_steps + 1)), np.float64)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: rates[min(step, num_steps)] /
                                                        o.learning_rate)


def inputs(batch: dict[str, np.ndarray], next_sentence: bool = True, token_types: bool = True
           ) -> dict[str, torch.Tensor]:
    """This project's batch -> the model's arguments (labels -100 where nothing is predicted); ModernBERT takes no
    token types (token_types=False)."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows, cols = np.nonzero(batch["masked_lm_weights"])
    labels[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
    out = dict(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
               attention_mask=torch.from_numpy(batch["input_mask"].astype(np.int64)),
               labels=torch.from_numpy(labels))
    if token_types:
        out["token_type_ids"] = torch.from_numpy(batch["segment_ids"].astype(np.int64))
    if next_sentence:
        out["next_sentence_label"] = torch.from_numpy(batch["next_sentence_labels"].astype(np.int64))
    return out


def peer_inputs(batch: dict[str, np.ndarray], config) -> dict[str, torch.Tensor]:
    """inputs() for the peer of a pretraining config: NSP's labels where its objective has them, token types for
    BERT (ModernBERT has none)."""
    return inputs(batch, config.objective.next_sentence, config.model.name != "modernbert")


def loss_of(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's MLM loss (plus NSP where the batch has its labels). BertForPreTraining computes one only when
    both labels are given, so MLM alone (no NSP, as RoBERTa) is its masked-LM cross-entropy, taken here from its
    logits as it does; ModernBertForMaskedLM computes it itself (on the masked positions only)."""
    if isinstance(model, transformers.ModernBertForMaskedLM) or "next_sentence_label" in batch:
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
        logits = out.logits if isinstance(model, transformers.ModernBertForMaskedLM) else out.prediction_logits
        logits, targets = logits[masked], batch["labels"][masked]
        totals["mlm_loss"] += float(torch.nn.functional.cross_entropy(logits, targets)) / len(batches)
        totals["mlm_accuracy"] += float((logits.argmax(-1) == targets).float().mean()) / len(batches)
        if "next_sentence_label" in batch:
            right = out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]
            totals["nsp_accuracy"] += float(right.float().mean()) / len(batches)
    model.train()
    return totals if any("next_sentence_label" in b for b in batches) else {
        k: v for k, v in totals.items() if k != "nsp_accuracy"}
