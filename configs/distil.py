"""Pretraining distillation: a BERT student trained beside a frozen BERT teacher. DistilBERT (Sanh et al. 2019),
TinyBERT's general distillation (Jiao et al. 2020) and MiniLM (Wang et al. 2020), as sizes and losses of one
model ('distil', models/distillation/model.py) and one objective ("distillation", objectives/distillation/objective.py).

Launch (the teacher: a pretrain.train BERT workdir or a Hugging Face BERT directory; its tokenizer is taken
when config.tokenizer.path is empty):
  python -m pretrain.train --config=configs/distil.py:size=tiny --workdir=runs/distil_tiny \
      --config.distillation.teacher=runs/bert_tiny
  python -m pretrain.train --config=configs/distil.py:size=distilbert --workdir=/gcs/bucket/distilbert \
      --config.distillation.teacher=/path/to/bert-base-uncased \
      --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en
  (size=tinybert4 and size=minilm_l6_h384 the same, with their own workdirs)
then fine-tune the student as any BERT: python -m pretrain.finetune --config=configs/glue.py:task=sst2
--config.init=runs/distil_tiny (its `student/bert` subtree; models/families.py's 'distil' family).

Config string: `size=tiny|tiny_narrow|distilbert|tinybert4|minilm_l6_h384`, `loss=distilbert|tinybert|minilm`
(default: the size's own). config.model's BERT fields are the student's; teacher_layers, teacher_hidden_size,
teacher_num_heads and teacher_intermediate_size the teacher's (0: the student's). A student of its teacher's
width starts from every other teacher layer (student layer i <- teacher layer 2i, DistilBERT's initialisation); a
narrower one at random (TinyBERT, MiniLM).
- tiny: a 1-layer student of configs/bert.py:size=tiny's 2 layers, the short recipe (demo corpus). 1,312,832
  parameters.
- tiny_narrow: the same teacher and a 1-layer student of half its width (64 hidden, 2 heads, FFN 256), at random;
  TinyBERT's losses by default (with loss=minilm, MiniLM's). 611,456 parameters (599,168 in `student/bert`).
- tinybert4: TinyBERT-4, 4 layers, hidden 312, 12 heads, FFN 1200 (teacher BERT-Base). 14,479,050 parameters
  (14,350,248 in `student/bert`; the paper: 14.5M).
- minilm_l6_h384: MiniLM-L6-H384, 6 layers, hidden 384, 12 heads, FFN 1536 (teacher BERT-Base). 22,892,346
  parameters (22,713,216 in `student/bert`; the paper: 22M).
- distilbert: 6 layers of BERT-Base (teacher bert-base-uncased, 12 layers). 66,985,530 parameters (paper: "66M";
  its teacher without the NSP head has 110,104,890).
The counts are the `student` subtree. A student of its teacher's width is DistilBERT's shape (no token types, no
pooler: model.distilbert_student), equal to transformers' DistilBertForMaskedLM, which `pretrain.tools.export_hf_bert`
writes (tests/models/test_distilbert.py checks both). A narrower one keeps token types and the pooler, as TinyBERT's
and MiniLM's released checkpoints do: Hugging Face's BertForPreTraining of that shape less its NSP head. TinyBERT's
W_h and W_e are outside it (module-level `hidden_fit`, `embedding_fit`).

The losses (objectives/distillation/objective.py; every alpha not named is 0):
- distilbert: 5.0 * T^2 KL(teacher/T || student/T) + 2.0 * MLM + 1.0 * cosine of the last hidden states, T = 2.
  The recipe (DistilBERT, Section 3-4, and its released training script, Hugging Face's examples/
  research_projects/distillation): dynamic masking without NSP; batches of about 4K sequences (gradient
  accumulation) of up to 512 tokens; Adam lr 5e-4, warmup 5% then linear decay, eps 1e-6, no weight decay,
  gradient clipping 5.0; 3 epochs of English Wikipedia + Toronto BookCorpus (about 3.3B tokens: 4,800 steps of
  4096 x 512). Target: GLUE dev macro-score 77.0 (BERT-Base 79.5), "97% of BERT's performance", 60% faster.
- tinybert: general distillation (Section 3.1-3.3), 1.0 each on the attention-score MSE and the hidden-state MSE
  of every student layer m against teacher layer g(m) = m * N / M, and the embedding MSE; W_h and W_e learned
  (the released code, general_distill.py, shares one W between embeddings and layers: the paper's two here); no
  soft targets (those are its task distillation). The recipe (Section 4.1 and the released command): English
  Wikipedia (2,500M words), sequences of 128, 3 epochs (about 300,000 steps of 256), batch 256, lr 5e-5 (the
  script's default), warmup 10% then linear decay, weight decay 0.01. Target (after its task distillation, with
  data augmentation): TinyBERT-4 keeps "more than 96.8%" of BERT-Base's GLUE score, 7.5x smaller, 9.4x faster.
- minilm: 1.0 * the KL of the last layers' attention distributions + 1.0 * the KL of their value relations
  (Section 3.1); no MLM, no soft targets, no layer mapping; the heads pair up one by one (the same number in
  student and teacher). The recipe (Section 4.1): English Wikipedia + BookCorpus, sequences of 512, batch 256,
  Adam lr 3e-4 (b2 0.999), warmup 4,000 steps then linear decay, weight decay 0.01, dropout 0.1, 400,000 steps
  (batch 1024 and lr 5e-4 for its 6 x 768 student). Target: the paper's 6 x 384 row (Table 3: SQuAD 2.0 and
  MNLI-m dev, where BERT-Base has 76.8 and 84.5).
"""
import ml_collections

from configs import bert, common

SIZES = {  # name: (configs/bert.py size of the teacher, the student's (layers, hidden, heads, FFN); 0: the teacher's)
    "tiny": ("tiny", (1, 0, 0, 0)),
    "tiny_narrow": ("tiny", (1, 64, 2, 256)),
    "distilbert": ("base", (6, 0, 0, 0)),
    "tinybert4": ("base", (4, 312, 12, 1200)),
    "minilm_l6_h384": ("base", (6, 384, 12, 1536)),
}
LOSS_OF_SIZE = {"tiny": "distilbert", "tiny_narrow": "tinybert", "distilbert": "distilbert",
                "tinybert4": "tinybert", "minilm_l6_h384": "minilm"}
LOSSES = {  # name: config.objective's alphas that are not 0
    "distilbert": {"alpha_ce": 5.0, "alpha_mlm": 2.0, "alpha_cos": 1.0},
    "tinybert": {"alpha_attention_mse": 1.0, "alpha_hidden": 1.0, "alpha_embedding": 1.0},
    "minilm": {"alpha_attention_kl": 1.0, "alpha_value_relation": 1.0},
}
ALPHAS = tuple(sorted({key for alphas in LOSSES.values() for key in alphas}))  # each is 0 in the losses that omit it

RECIPES = {
    "tiny": {"num_train_steps": 300},  # on top of configs/bert.py's short recipe (demo corpus)
    "tiny_narrow": {"num_train_steps": 300},
    "distilbert": {
        "batch_size": 4096, "grad_accum_steps": 16, "num_train_steps": 4800, "optimizer.learning_rate": 5e-4,
        "optimizer.warmup_steps": 240, "optimizer.weight_decay": 0.0, "optimizer.grad_clip_norm": 5.0,
        "data.max_seq_length": 512, "data.long_seq_length": 0, "objective.max_predictions_per_seq": 80,
        "checkpoint_every": 500, "eval_every": 500, "log_every": 20,
    },
    "tinybert4": {
        "batch_size": 256, "num_train_steps": 300_000, "optimizer.learning_rate": 5e-5,
        "optimizer.warmup_steps": 30_000, "optimizer.weight_decay": 0.01, "data.max_seq_length": 128,
        "data.long_seq_length": 0, "checkpoint_every": 10_000, "eval_every": 10_000, "log_every": 100,
    },
    "minilm_l6_h384": {
        "batch_size": 256, "num_train_steps": 400_000, "optimizer.learning_rate": 3e-4,
        "optimizer.warmup_steps": 4_000, "optimizer.weight_decay": 0.01, "data.max_seq_length": 512,
        "data.long_seq_length": 0, "objective.max_predictions_per_seq": 80,
        "checkpoint_every": 10_000, "eval_every": 10_000, "log_every": 100,
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="distilbert", loss="")
    if arg.size not in SIZES:
        raise ValueError(f"configs/distil.py: size={arg.size!r} is not one of {list(SIZES)}")
    loss = arg.loss or LOSS_OF_SIZE[arg.size]
    if loss not in LOSSES:
        raise ValueError(f"configs/distil.py: loss={loss!r} is not one of {list(LOSSES)}")
    teacher_size, (layers, hidden, heads, ffn) = SIZES[arg.size]
    c = bert.get_config(f"size={teacher_size},nsp=False")  # the teacher's architecture, MLM-only batches
    with c.unlocked():
        c.model.name = "distil"
        c.model.teacher_layers, c.model.num_layers = c.model.num_layers, layers
        for key, student in (("hidden_size", hidden), ("num_heads", heads), ("intermediate_size", ffn)):
            c.model[f"teacher_{key}"] = 0  # the student's
            if student:  # a narrower student: config.model's BERT fields are the student's
                c.model[f"teacher_{key}"], c.model[key] = c.model[key], student
        c.model.distilbert_student = not hidden  # DistilBERT drops token types and the pooler; TinyBERT, MiniLM keep them
        c.objective.name = "distillation"
        c.objective.temperature = 2.0
        c.objective.update({key: LOSSES[loss].get(key, 0.0) for key in ALPHAS})
        c.distillation = ml_collections.ConfigDict(dict(teacher=""))  # a BERT workdir or Hugging Face directory
        if teacher_size == "base":  # the teacher's tokenizer (leave empty: taken from the teacher)
            c.tokenizer.update(kind="wordpiece", path="", lowercase=True)
    c.update_from_flattened_dict(RECIPES[arg.size])
    c.lock()
    return c
