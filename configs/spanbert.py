"""SpanBERT pretraining (Joshi et al., 2020): span masking + span boundary objective, no NSP.

Launch (demo corpus and tokenizer come from `make demo`):
  python -m pretrain.train --config=configs/spanbert.py:size=tiny --workdir=runs/spanbert_tiny
  python -m pretrain.train --config=configs/spanbert.py:size=large --workdir=/gcs/bucket/spanbert_large \
      --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en \
      --config.tokenizer.kind=wordpiece --config.tokenizer.path=vocab.txt

Config string: `size=tiny|mini|small|medium|base|large` (default large), `recipe=paper|short` (as
configs/bert.py: tiny and mini default to short).

The recipe of the paper (Section 3 and 4.1), on top of BERT's model sizes and optimizer:
  * span masking: span lengths in whole words ~ Geometric(p=0.2) clipped at 10 (mean 3.8 words),
    spans drawn until 15% of the tokens are masked, each span replaced as a unit: 80% [MASK],
    10% random tokens, 10% unchanged;
  * loss = MLM + SBO, the SBO a 2-layer feed-forward network (GeLU + LayerNorm) over the two
    boundary states and a relative position embedding, decoding through the tied embeddings;
  * single segments of up to 512 tokens, no next sentence prediction, no short-sequence sampling
    and no 128-token first phase;
  * batch 256, Adam lr 1e-4 (b1 0.9, b2 0.999, weight decay 0.01), 10,000 warmup steps then
    linear decay, 2.4M steps; dropout 0.1.
Target: SpanBERT-Large (same size as BERT-Large plus the SBO head) reaches SQuAD 1.1 F1 94.6 and
SQuAD 2.0 F1 88.7 after fine-tuning (paper Table 1). The short recipe is BERT's short recipe
(laptop-sized, sequences of 128) with the SpanBERT objective.
"""
import ml_collections

from configs import bert, common

PAPER = {  # flattened overrides of configs/bert.py's paper recipe
    "num_train_steps": 2_400_000,
    "data.max_seq_length": 512, "data.long_seq_length": 0,
    "objective.max_predictions_per_seq": 80, "objective.short_seq_prob": 0.0,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="large", recipe="")  # the paper's headline model is Large
    recipe = arg.recipe or ("short" if arg.size in bert.SMALL_SIZES else "paper")
    c = bert.get_config(f"size={arg.size},nsp=False,recipe={recipe}")
    with c.unlocked():
        c.model.span_boundary = True
        c.model.max_span_tokens = 32  # relative positions in the SBO table: 10 words of ~3 pieces
        c.objective = ml_collections.ConfigDict(dict(
            name="spanbert",
            mask_prob=0.15, replace_with_mask=0.8, replace_with_random=0.1,
            geometric_p=0.2, max_span_length=10,
            max_predictions_per_seq=c.objective.max_predictions_per_seq,
            long_max_predictions_per_seq=c.objective.long_max_predictions_per_seq,
            # the one NSP switch of configs/bert.py (off: nsp=False above), which the model's head follows
            next_sentence=c.objective.get_ref("next_sentence"), short_seq_prob=c.objective.short_seq_prob))
    if recipe == "paper":
        c.update_from_flattened_dict(PAPER)
    c.lock()
    return c
