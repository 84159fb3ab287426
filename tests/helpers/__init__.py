"""What several test files share, by subject: test modules import from here (and take conftest.py's fixtures),
never from one another (tests/test_suite_layout.py checks it).

paths (REPO, SHARED_DATA) commands (the real commands as a user runs them, at the suite's XLA level)
tiny_bert (the seconds-long BERT run's flags and config) asserts (one-line errors, equal trees)
data (a WordPiece vocabulary, a TFDS corpus prepared offline, fake tokenizer / objective / documents)
random_weights (GPT and T5 weights of O(1) activations, drawn in numpy) toy_decoders (toy models for
models/decoding.py and their plain-Python references) peft_reference (the Hugging Face / peft side of the
PEFT parity tests) command_server (many `python -m` commands forked from one process: a program, not a library).
"""
