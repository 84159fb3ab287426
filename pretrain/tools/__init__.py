"""The tools a user runs around a run, each `python -m pretrain.tools.NAME --help`: build_corpus (the offline
English corpus), train_tokenizer (SentencePiece), prepare_corpus (tokenized ArrayRecord shards), aot_compile
(fits a TPU slice or not), plot_metrics (loss curves), export_hf_bert (a Hugging Face directory) and
make_task_files (small CoNLL/SQuAD files for the demos). Entry-point level: they import the rooms below
pretrain, and no entry point imports them."""
