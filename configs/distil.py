"""DistilBERT (Sanh et al. 2019): a BERT student distilled from a BERT teacher during pretraining.

Launch (the teacher: a pretrain.train BERT workdir or a Hugging Face BERT directory; its tokenizer is taken
when config.tokenizer.path is empty):
  python -m pretrain.train --config=configs/distil.py:size=tiny --workdir=runs/distil_tiny \
      --config.distillation.teacher=runs/bert_tiny
  python -m pretrain.train --config=configs/distil.py:size=distilbert --workdir=/gcs/bucket/distilbert \
      --config.distillation.teacher=/path/to/bert-base-uncased \
      --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en
then fine-tune the student as any BERT: python -m pretrain.finetune --config=configs/glue.py:task=sst2
--config.init=runs/distil_tiny (its `student/bert` subtree; models/registry.py's 'distil' family).

Config string: `size=tiny|distilbert`. tiny: a 1-layer student of configs/bert.py:size=tiny's 2 layers, the short
recipe (demo corpus). distilbert: 6 layers of BERT-Base (teacher bert-base-uncased, 12 layers), student layer i
<- teacher layer 2i. The student is DistilBERT's shape (no token types, no pooler: transformers'
DistilBertForMaskedLM, which `pretrain.tools.export_hf_bert` writes). Exact parameter counts of the students, equal
to DistilBertForMaskedLM's (tests/models/test_distilbert.py checks both): tiny student 1,312,832,
distilbert student 66,985,530 (paper: "66M"; its teacher without the NSP head has 110,104,890).

The recipe (DistilBERT, Section 3-4, and its released training script, Hugging Face's examples/research_projects/
distillation): loss 5.0 * T^2 KL(teacher/T || student/T) + 2.0 * MLM + 1.0 * cosine of the last hidden states
(objectives/distillation.py), T = 2; dynamic masking without NSP; batches of about 4K sequences (gradient
accumulation) of up to 512 tokens; Adam lr 5e-4, warmup 5% then linear decay, eps 1e-6, no weight decay, gradient
clipping 5.0; 3 epochs of English Wikipedia + Toronto BookCorpus (about 3.3B tokens: 4,800 steps of 4096 x 512).
Target: GLUE dev macro-score 77.0 (BERT-Base 79.5), "97% of BERT's performance", 60% faster.
"""
import ml_collections

from configs import bert, common

SIZES = {  # name: (configs/bert.py size of the teacher, student layers)
    "tiny": ("tiny", 1),
    "distilbert": ("base", 6),
}

RECIPES = {
    "tiny": {"num_train_steps": 300},  # on top of configs/bert.py's short recipe (demo corpus)
    "distilbert": {
        "batch_size": 4096, "grad_accum_steps": 16, "num_train_steps": 4800, "optimizer.learning_rate": 5e-4,
        "optimizer.warmup_steps": 240, "optimizer.weight_decay": 0.0, "optimizer.grad_clip_norm": 5.0,
        "data.max_seq_length": 512, "data.long_seq_length": 0, "objective.max_predictions_per_seq": 80,
        "checkpoint_every": 500, "eval_every": 500, "log_every": 20,
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, size="distilbert")
    if arg.size not in SIZES:
        raise ValueError(f"configs/distil.py: size={arg.size!r} is not one of {list(SIZES)}")
    teacher_size, student_layers = SIZES[arg.size]
    c = bert.get_config(f"size={teacher_size},nsp=False")  # the teacher's architecture, MLM-only batches
    with c.unlocked():
        c.model.name = "distil"
        c.model.teacher_layers = c.model.num_layers
        c.model.num_layers = student_layers
        c.objective.name = "distillation"
        c.objective.temperature = 2.0
        c.objective.alpha_ce = 5.0
        c.objective.alpha_mlm = 2.0
        c.objective.alpha_cos = 1.0
        c.distillation = ml_collections.ConfigDict(dict(teacher=""))  # a BERT workdir or Hugging Face directory
        if arg.size == "distilbert":  # the teacher's tokenizer (leave empty: taken from the teacher)
            c.tokenizer.update(kind="wordpiece", path="", lowercase=True)
    c.update_from_flattened_dict(RECIPES[arg.size])
    c.lock()
    return c
