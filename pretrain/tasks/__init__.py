"""Token-level and span tasks beside GLUE (J&M 11.3.3-11.3.4): CoNLL-style sequence labelling (conll) and
SQuAD-style extractive question answering (squad): their files, their checks and their official metrics."""
