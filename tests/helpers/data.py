"""Small inputs of the data layer: a WordPiece vocabulary, a TFDS text corpus prepared offline, and the fake
tokenizer, BERT objective and random documents that the batch pipelines run on."""
from __future__ import annotations

import types

import ml_collections
import numpy as np

from objectives import build_objective

# A WordPiece vocabulary file's lines: specials first ([unused0] a special too, [UNK] a real token), then whole
# words and ##continuations.
WORDPIECE_VOCAB = [
    "[PAD]",
    "[unused0]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "quick",
    "fox",
    "un",
    "##aff",
    "##able",
    "jump",
    "##ed",
    ".",
    ",",
    "hello",
    "world",
]

# The TFDS corpus's examples: 7 documents of two lines, then one with no text (a reader must drop it).
TFDS_TEXTS = [f"Document {i} first line.\n\n  Document {i} second line.  \n" for i in range(7)]
TFDS_TEXTS.append("\n \n")


def tfds_builder_class(tfds):
    """A TFDS builder `pretrain_test_corpus` of TFDS_TEXTS (its `text` feature); define it inside
    `tfds.core.registered.skip_registration()`, as for a dataset prepared by another job."""
    class PretrainTestCorpus(tfds.core.GeneratorBasedBuilder):
        """A tiny text dataset, prepared offline."""

        VERSION = tfds.core.Version("1.0.0")
        # tfds 4.9.10 looks up a packaged builder's source dir (for checksums) via importlib_resources,
        # a dependency it declares only for Python < 3.9; a test builder has no checksums anyway.
        code_path = None

        def _info(self):
            # DatasetInfo directly: dataset_info_from_configs needs the builder to live in a package.
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            yield from ((i, {"text": text}) for i, text in enumerate(TFDS_TEXTS))

    return PretrainTestCorpus


FAKE_VOCAB = 200


def fake_tokenizer():
    """What objectives read of a tokenizer: sizes and special ids, every token a word start."""
    return types.SimpleNamespace(vocab_size=FAKE_VOCAB, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                                 special_ids=(0, 2, 3, 4), word_start=np.ones(FAKE_VOCAB, bool))


def bert_objective():
    """BERT's masked LM + next sentence prediction over fake_tokenizer (5 masked positions, 20 in the long phase)."""
    config = ml_collections.ConfigDict(dict(
        name="bert_pretraining", mask_prob=0.15, replace_with_mask=0.8, replace_with_random=0.1,
        max_predictions_per_seq=5, long_max_predictions_per_seq=20, whole_word_masking=False,
        next_sentence=True, short_seq_prob=0.1))
    return build_objective(config, fake_tokenizer())


def random_documents(n=40, seed=0):
    """n documents of 2-7 sentences of 3-14 non-special token ids each."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(5, FAKE_VOCAB, rng.integers(3, 15)).astype(np.int32) for _ in range(rng.integers(2, 8))]
            for _ in range(n)]
