"""Next sentence prediction (BERT): sentence-pair instances from documents, and the loss.

`create_instances` is one pass (one "dupe") of Google BERT's `create_pretraining_data.py` over a
tokenized corpus, without the masking: masking is dynamic and done per batch by
`objectives.mlm.mask_tokens`. It loops over sentences in Python (it runs once per pass over the
corpus, not per step) and pads the result with numpy. Differences from the original, all chosen
to keep the distribution while making it cheaper or sturdier:
  * the random "next" document is drawn uniformly from the *other* documents (the original
    retries 10 times and may, rarely, keep the same document);
  * `truncate_seq_pair` is done in closed form: how many tokens leave A and B depends only on
    their lengths, and the front/back coin per removed token becomes one binomial draw;
  * empty sentences and documents are dropped first (the original drops empty documents).
Labels follow BERT: 0 = B is the true continuation, 1 = B is random.

Sentence-order prediction (ALBERT, Lan et al. 2020; `sentence_order=True`): A and B are two consecutive
segments of one document, swapped with probability 1/2; the label (in `next_sentence_labels`, read by the same
head) is 1 = swapped, as transformers' `sentence_order_label`. A chunk of a single sentence is cut inside the
sentence (ALBERT's code takes B from a random document there, which would leak topic cues into SOP); a chunk
of one token makes no pair.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax


def _trim(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Removes n tokens, each from the front or the back with probability 1/2."""
    front = int(rng.binomial(n, 0.5)) if n else 0
    return x[front:len(x) - (n - front)]


def _truncate_pair(a: np.ndarray, b: np.ndarray, max_num_tokens: int, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    """BERT's truncate_seq_pair: pop from the longer one (B on ties) until the pair fits."""
    excess = len(a) + len(b) - max_num_tokens
    if excess <= 0:
        return a, b
    gap = min(excess, abs(len(a) - len(b)))  # first the longer one shrinks to the other's length,
    rest = excess - gap                       # then they alternate, B first (ties go to B).
    cut_a = rest // 2 + (gap if len(a) > len(b) else 0)
    cut_b = rest - rest // 2 + (gap if len(b) > len(a) else 0)
    return _trim(a, cut_a, rng), _trim(b, cut_b, rng)


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: np.random.Generator) -> int:
    # Mostly fill the sequence; sometimes (short_seq_prob) aim shorter, to match fine-tuning.
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_num_tokens + 1))
    return max_num_tokens


def _pairs_from_document(docs: list[list[np.ndarray]], d: int, max_num_tokens: int,
                         short_seq_prob: float, rng: np.random.Generator
                         ) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """`create_instances_from_document`: (tokens_a, tokens_b, is_random_next) triples."""
    doc = docs[d]
    target = _target_length(max_num_tokens, short_seq_prob, rng)  # once per document, as BERT
    out = []
    chunk: list[np.ndarray] = []
    length = 0
    i = 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            # A = chunk[:a_end]; B = the rest of the chunk, or text from another document.
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = np.concatenate(chunk[:a_end])
            if len(chunk) == 1 or rng.random() < 0.5:
                other = int(rng.integers(len(docs) - 1))
                other += other >= d  # uniform over the other documents
                rdoc = docs[other]
                start = int(rng.integers(len(rdoc)))
                # Whole sentences from `start` until B reaches its share of the target.
                lens = np.cumsum([len(s) for s in rdoc[start:]])
                stop = start + min(int(np.searchsorted(lens, target - len(a))), len(lens) - 1) + 1
                b = np.concatenate(rdoc[start:stop])
                i -= len(chunk) - a_end  # "put back" the unused sentences of this chunk
                is_random = 1
            else:
                b = np.concatenate(chunk[a_end:])
                is_random = 0
            a, b = _truncate_pair(a, b, max_num_tokens, rng)
            out.append((a, b, is_random))
            chunk, length = [], 0
        i += 1
    return out


def _ordered_pairs_from_document(doc: list[np.ndarray], max_num_tokens: int, short_seq_prob: float,
                                 rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """SOP: (tokens_a, tokens_b, swapped) from consecutive segments of `doc`, chunked as _pairs_from_document."""
    target = _target_length(max_num_tokens, short_seq_prob, rng)
    out, chunk, length = [], [], 0
    for i, sentence in enumerate(doc):
        chunk.append(sentence)
        length += len(sentence)
        if i < len(doc) - 1 and length < target:
            continue
        if len(chunk) >= 2:  # A = the first a_end sentences, B = the rest of the chunk
            a_end = int(rng.integers(1, len(chunk)))
            a, b = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
        else:                # one sentence: cut it in two
            a, b = chunk[0][:0], chunk[0][:0]
            if len(chunk[0]) >= 2:
                cut = int(rng.integers(1, len(chunk[0])))
                a, b = chunk[0][:cut], chunk[0][cut:]
        if len(a):
            swapped = int(rng.random() < 0.5)
            a, b = (b, a) if swapped else (a, b)
            a, b = _truncate_pair(a, b, max_num_tokens, rng)  # after the swap, as ALBERT's code
            out.append((a, b, swapped))
        chunk, length = [], 0
    return out


def _packed_from_document(doc: list[np.ndarray], max_num_tokens: int, short_seq_prob: float,
                          rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """No-NSP (RoBERTa DOC-SENTENCES): whole consecutive sentences packed up to the target."""
    target = _target_length(max_num_tokens, short_seq_prob, rng)
    out, chunk, length = [], [], 0
    for s in doc:
        s = s[:max_num_tokens]  # a sentence longer than the whole budget is truncated
        if chunk and length + len(s) > target:
            out.append((np.concatenate(chunk), s[:0], 0))
            chunk, length = [], 0
        chunk.append(s)
        length += len(s)
    if chunk:
        out.append((np.concatenate(chunk), doc[0][:0], 0))
    return out


def _no_instance(next_sentence: bool, sentence_order: bool) -> str:
    """The error when the documents made no instance, naming the mode in use. Only sentence order can get there
    (a document of one token cannot be cut in two); the other modes make one from any non-empty document."""
    if sentence_order:
        return "no sentence-order pair: every document is a single token (add text)"
    what = "next-sentence pair" if next_sentence else "packed sequence (next_sentence=False)"
    return f"no {what}: the documents made none (add text)"


def create_instances(documents: list[list[np.ndarray]],
                     rng: np.random.Generator, *, max_seq_length: int, short_seq_prob: float = 0.1,
                     cls_id: int, sep_id: int, pad_id: int, next_sentence: bool = True,
                     sentence_order: bool = False) -> dict[str, np.ndarray]:
    """One pass of create_pretraining_data over all documents (documents visited in random order).

    Args:
        documents: documents -> sentences -> int token ids (no specials).
        rng: numpy Generator; shuffles documents and instances and draws every choice.
        max_seq_length: L, including [CLS] and [SEP]s.
        short_seq_prob: per document, the probability of a target length uniform in
            [2, max_num_tokens] instead of max_num_tokens (= L - 3 with NSP, L - 2 without).
        next_sentence: False packs whole sentences of one document into `[CLS] ... [SEP]`
            (segment ids all 0, labels all 0), for RoBERTa-style pretraining without NSP.
        sentence_order: ALBERT's SOP pairs (needs next_sentence): B follows A in the same document,
            and the two are swapped with probability 1/2 (label 1 = swapped).

    Returns:
        {'input_ids': [N, L] int32 padded with pad_id, 'segment_ids': [N, L] int32 (0 on
         [CLS] A [SEP] and padding, 1 on B [SEP]), 'input_mask': [N, L] int32 (1 = real token),
         'next_sentence_labels': [N] int32 (0 = true continuation, 1 = random B)}.
    """
    docs = [[np.asarray(s, np.int32) for s in d if len(s)] for d in documents]
    docs = [d for d in docs if d]
    n_special = 3 if next_sentence else 2
    max_num_tokens = max_seq_length - n_special
    if max_num_tokens < 2:
        raise ValueError(f"max_seq_length={max_seq_length} is too short: need at least "
                         f"{n_special + 2} for the special tokens plus 2 text tokens")
    if sentence_order and not next_sentence:
        raise ValueError("sentence_order=True makes sentence pairs for the NSP head: it needs next_sentence=True")
    if next_sentence and not sentence_order and len(docs) < 2:
        raise ValueError(f"corpus has {len(docs)} non-empty document(s), too small: need at least "
                         "2 non-empty documents for next sentence prediction "
                         "(or set next_sentence=False)")
    if not docs:
        raise ValueError("corpus is empty: need at least 1 non-empty document")

    pairs = []
    for d in rng.permutation(len(docs)):
        if sentence_order:
            pairs += _ordered_pairs_from_document(docs[d], max_num_tokens, short_seq_prob, rng)
        elif next_sentence:
            pairs += _pairs_from_document(docs, int(d), max_num_tokens, short_seq_prob, rng)
        else:
            pairs += _packed_from_document(docs[d], max_num_tokens, short_seq_prob, rng)
    if not pairs:
        raise ValueError(_no_instance(next_sentence, sentence_order))
    pairs = [pairs[k] for k in rng.permutation(len(pairs))]

    # Pad with numpy: lay [CLS] A [SEP] (B [SEP]) out by lengths, scatter all tokens at once.
    la = np.array([len(a) for a, _, _ in pairs])
    lb = np.array([len(b) for _, b, _ in pairs])
    n = len(pairs)
    total = la + lb + n_special  # [N]
    cols = np.arange(max_seq_length)
    input_mask = cols < total[:, None]  # [N, L]
    segment_ids = (input_mask & (cols > la[:, None] + 1)).astype(np.int32)
    input_ids = np.full((n, max_seq_length), pad_id, np.int32)
    input_ids[:, 0] = cls_id
    input_ids[np.arange(n), la + 1] = sep_id
    if next_sentence:
        input_ids[np.arange(n), total - 1] = sep_id
    in_a = (cols >= 1) & (cols <= la[:, None])
    in_b = (cols > la[:, None] + 1) & (cols < total[:, None] - 1)  # empty without NSP
    tokens = np.concatenate([t for a, b, _ in pairs for t in (a, b)])
    input_ids[in_a | in_b] = tokens  # row-major order: A then B, row by row
    return {"input_ids": input_ids, "segment_ids": segment_ids,
            "input_mask": input_mask.astype(np.int32),
            "next_sentence_labels": np.array([r for _, _, r in pairs], np.int32)}


def nsp_loss(logits: jax.Array, labels: jax.Array, name: str = "nsp") -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean cross-entropy of the [CLS] classifier. logits: [B, 2], labels: [B] int. The metrics are
    `{name}_loss` and `{name}_accuracy` (name "sop" for sentence-order prediction)."""
    logits = logits.astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    acc = (jnp.argmax(logits, axis=-1) == labels).mean()
    return loss, {f"{name}_loss": loss, f"{name}_accuracy": acc}
