"""Scaled dot-product attention, one function over several implementations (`model.attention`).

- "einsum": the reference: explicit logits, float32 softmax, dropout on the probabilities; every mask, a sliding
  window included, as the dense [B|1, 1, L, S] array (`SegmentMask.dense`). The oracle the
  tests compare every other implementation against, and the only one that drops attention probabilities
  out (the fused kernels keep no [B, H, L, S] matrix to drop from). `attention_with_weights` runs it whatever
  `model.attention` says and returns its scores and probabilities too (what distillation reads).
- "xla": `jax.nn.dot_product_attention(implementation="xla")`: JAX's own composition, which XLA fuses;
  logits in float32 as here. A `SegmentMask`'s causal flag and sliding window enter as its `is_causal` and
  `local_window_size` (JAX builds the band inside, beside the segments' mask); the FLOPs are still the whole
  [L, S] product, a window saves nothing here.
- "cudnn": the same function with `implementation="cudnn"`: cuDNN's flash attention (GPU only; float16
  or bfloat16 inputs, head dim a multiple of 8 up to 128). Its sliding window is one-sided: a causal window
  enters as `local_window_size`, a two-sided one (ModernBERT's) falls back to the dense band in the mask, which
  JAX adds as a bias [B|1, 1, L, S]. Checked here by the arguments it is called with (no GPU in the tests).
- "pallas": JAX's Pallas flash-attention kernel for TPU (models/attention_tpu.py): blocks of 128 queries x 128
  keys in VMEM, no [L, S] matrix in HBM for the softmax; query and key lengths multiples of 128. A `SegmentMask`
  enters as the kernel's own segment ids and causal flag; a dense mask (prefix LM, leading keys) and T5's bias as
  its additive `ab` input ([B, H, L, S], which the kernel differentiates, so T5's relative-position table learns).
  A sliding window enters as `ab` too: computed over every block, it saves nothing.
- "splash": JAX's block-sparse splash kernel for TPU (models/attention_tpu.py, MaxText's): the static part of a
  `SegmentMask` (full, causal, a sliding window, both) decides at trace time which 128 x 128 blocks hold anything,
  and only those are computed, forward and backward; the segments mask inside them. A window of 64 keys either
  side over 1,024 tokens visits 3 blocks of 8 per query block. No additive input: T5's bias and dense masks take
  "pallas". A scanned ModernBERT layer, whose kind is traced, runs one of two compiled kernels (lax.cond).
  Both TPU kernels run per shard under a mesh (shard_map over the batch axes, heads over `tensor`) and are tested
  on the CPU in Pallas' TPU interpret mode; they compile for TPU with libtpu (pretrain/tools/aot_compile.py).
- "auto": the fastest that applies: cuDNN on a GPU in half precision; on a TPU where the lengths tile, splash for
  a `SegmentMask` without a bias, else Pallas' flash kernel; XLA elsewhere; the reference wherever attention
  dropout is active (training with `attention_dropout_rate > 0`).

Shapes: B = batch, L = query length, S = key length, H = heads, K = head dim.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from models import attention_tpu

IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn", "pallas", "splash")
FUSED = ("xla", "cudnn", "pallas", "splash")  # none of them can drop attention probabilities out
TPU_KERNELS = ("pallas", "splash")


@flax.struct.dataclass
class SegmentMask:
    """A mask kept as what it is made of: a query attends to the keys of its own segment (ids 0 = padding,
    which neither attends nor is attended to; a 0/1 padding mask is the unpacked case; no ids: one segment)
    and, if `causal`, to keys at or before its position only. `dense()` is the [B|1, 1, L, S] bool array
    the reference takes; the fused kernels take the parts: the TPU kernels their segment ids and causal flag (no
    [L, S] matrix anywhere), XLA and cuDNN `is_causal` beside the segments' mask.
    `window` > 0: a sliding window (ModernBERT's local attention): query i attends only to keys j with
    |i - j| <= window, by index in the row (in a packed row, the distance inside the example). XLA takes it as
    `local_window_size` (cuDNN only with `causal`: its window is one-sided), splash as its block-sparse mask; the
    reference, cuDNN otherwise and Pallas' flash kernel as the band in the dense mask or the additive input.
    `windowed` [] bool, traced: whether the window applies (a scanned ModernBERT layer's kind; None: it does): the
    band becomes `window | ~windowed`, which Pallas' flash kernel takes as an input every row shares, and splash
    runs the kernel of the layer's kind."""
    q_segments: jax.Array | None = None    # [B|1, L] int; None: one segment, no padding
    kv_segments: jax.Array | None = None   # [B|1, S] int; None exactly when q_segments is
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    window: int = flax.struct.field(pytree_node=False, default=0)
    windowed: jax.Array | None = None      # [] bool

    def dense(self, q_len: int, kv_len: int) -> jax.Array | None:  # [B|1, 1, L, S] bool, True = may attend
        mask = None if self.q_segments is None else segment_mask(self.q_segments, self.kv_segments)
        if (self.causal or self.window) and q_len != kv_len:
            raise ValueError(f"a causal or sliding-window mask relates a sequence to itself: {q_len} queries, "
                             f"{kv_len} keys")
        for part in (causal_mask(q_len) if self.causal else None, self.shared(q_len)):
            if part is not None:
                mask = part if mask is None else mask & part
        return mask

    def shared(self, length: int) -> jax.Array | None:
        """[1, 1, L, L] bool: the window every row shares (where `windowed`), or None."""
        window = window_mask(length, self.window)
        if window is None or self.windowed is None:
            return window
        return window | ~self.windowed

    def kept_pairs(self, q_len: int, kv_len: int) -> int:
        """The (query, key) pairs the mask's static part keeps: what a kernel that skips masked blocks computes at
        the least (the segments depend on the data; a traced `windowed` counts as the window)."""
        queries = np.arange(q_len)
        first = np.maximum(queries - self.window, 0) if self.window else np.zeros(q_len, int)
        last = queries if self.causal else (queries + self.window if self.window else np.full(q_len, kv_len - 1))
        return int(np.clip(np.minimum(last, kv_len - 1) - first + 1, 0, None).sum())


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
    """[B, L] and [B, S] segment ids (0 = padding, 1..n = packed example) -> [B, 1, L, S] mask.

    A token attends only to tokens of its own example; padding neither attends nor is attended to.
    For rows without packing the segment ids are simply the 0/1 padding mask.
    """
    same = query_segments[:, None, :, None] == key_segments[:, None, None, :]
    return same & (query_segments != 0)[:, None, :, None]


def causal_mask(length: int) -> jax.Array:
    """[1, 1, L, L]: query i attends to keys j <= i. In packed rows, combine with segment_mask."""
    return jnp.tril(jnp.ones((length, length), bool))[None, None]


def window_mask(length: int, window: int) -> jax.Array | None:
    """[1, 1, L, L]: query i attends to keys j with |i - j| <= window; None for window 0 (no limit)."""
    if not window:
        return None
    positions = jnp.arange(length)
    return (jnp.abs(positions[:, None] - positions[None, :]) <= window)[None, None]


def dense_mask(mask: jax.Array | SegmentMask | None, q_len: int, kv_len: int) -> jax.Array | None:
    """Either kind of mask as the [B|1, 1, L, S] bool array (None stays None)."""
    return mask.dense(q_len, kv_len) if isinstance(mask, SegmentMask) else mask


def prepend_keys_values(k: jax.Array, v: jax.Array, mask: jax.Array | None, bias: jax.Array | None,
                        extra: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
    """Puts P keys and values `extra` [2, P, H, K], the same for every row, before a layer's own [B, S, H, K]: every
    query that attends at all may attend to them; a dense mask [B|1, 1, L, S] grows P columns, and so does a bias
    [B|1, H, L, S] (with 0) unless it already covers them ([B|1, H, L, P + S]: T5's relative positions)."""
    batch, length = k.shape[0], extra.shape[1]
    keys = jnp.broadcast_to(extra[0][None].astype(k.dtype), (batch,) + extra.shape[1:])
    values = jnp.broadcast_to(extra[1][None].astype(v.dtype), (batch,) + extra.shape[1:])
    if mask is not None:
        seen = jnp.any(mask, axis=-1, keepdims=True)  # padding queries keep attending to nothing
        mask = jnp.concatenate([jnp.broadcast_to(seen, mask.shape[:-1] + (length,)), mask], axis=-1)
    if bias is not None and bias.shape[-1] == k.shape[1]:
        bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(length, 0)])
    return jnp.concatenate([keys, k], axis=1), jnp.concatenate([values, v], axis=1), mask, bias


def choose(implementation: str, dtype, head_dim: int, dropout_active: bool, q_len: int = 0, kv_len: int = 0,
           mask_in_parts: bool = False) -> str:
    """`model.attention` -> the implementation that runs for this call (resolved at trace time). `mask_in_parts`:
    the mask is a SegmentMask (or none) and there is no additive bias, which splash needs."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if dropout_active:
        if implementation in FUSED:
            raise ValueError(f"attention={implementation!r} cannot drop attention probabilities out: set "
                             "attention_dropout_rate=0 or attention='auto' (which uses the reference einsum then)")
        return "einsum"
    fits = attention_tpu.fits(q_len, kv_len, head_dim)
    if implementation in TPU_KERNELS and not fits:
        raise ValueError(f"attention={implementation!r} tiles queries and keys by {attention_tpu.BLOCK}: lengths "
                         f"{q_len} x {kv_len} (head dim {head_dim}) do not divide; use attention='auto' (XLA's "
                         "kernel for such shapes)")
    if implementation == "splash" and not mask_in_parts:
        raise ValueError("attention='splash' takes masks of segments, causality and a window only: an additive bias "
                         "(T5's relative positions) or a dense mask (a prefix LM, leading keys and values) needs "
                         "attention='pallas' or 'auto'")
    if implementation != "auto":
        return implementation
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    on = platform()
    if on == "gpu" and half and head_dim % 8 == 0 and head_dim <= 128:
        return "cudnn"
    if on == "tpu" and fits:
        return "splash" if mask_in_parts else "pallas"
    return "xla"


def dot_product_attention(q: jax.Array,                 # [B, L, H, K]
                          k: jax.Array,                 # [B, S, H, K]
                          v: jax.Array,                 # [B, S, H, K]
                          mask: jax.Array | SegmentMask | None,  # [B|1, 1, L, S] bool, True = may attend
                          bias: jax.Array | None,       # [B|1, H, L, S] additive (T5's relative positions)
                          *, scale: float,
                          implementation: str = "auto",
                          dropout: Callable[[jax.Array], jax.Array] | None = None,  # on [B, H, L, S] weights
                          ) -> jax.Array:               # [B, L, H, K] in q's dtype
    """softmax(scale * q.k + bias, masked) . v with the implementation `choose` picks."""
    in_parts = bias is None and (mask is None or isinstance(mask, SegmentMask))
    implementation = choose(implementation, q.dtype, q.shape[-1], dropout is not None, q.shape[1], k.shape[1],
                            mask_in_parts=in_parts)
    _count(q, k, mask)
    if implementation in TPU_KERNELS:
        return _tpu_kernel(implementation, q, k, v, mask, bias, scale)
    if implementation == "einsum":
        return _reference(q, k, v, dense_mask(mask, q.shape[1], k.shape[1]), bias, scale, dropout)[0]
    self_attention = isinstance(mask, SegmentMask) and q.shape[1] == k.shape[1]
    is_causal = self_attention and mask.causal
    # cuDNN's window reaches only to the left of the query (JAX raises for a right one without is_causal): a
    # two-sided band (ModernBERT's) stays in the dense mask, which JAX hands cuDNN as an additive bias; so does a
    # window a traced flag turns on
    native = self_attention and mask.windowed is None and (implementation == "xla" or is_causal)
    window = mask.window if native else 0
    if is_causal or window:  # the kernel's own causal and sliding-window masking, the segments' mask beside it
        mask = mask.replace(causal=False, window=0 if window else mask.window)
    if bias is not None:
        bias = bias.astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=dense_mask(mask, q.shape[1], k.shape[1]),
                                        scale=scale, is_causal=is_causal,
                                        local_window_size=(window, window) if window else None,
                                        implementation=implementation).astype(q.dtype)


def _tpu_kernel(implementation: str, q, k, v, mask, bias, scale):
    """Pallas' flash or splash kernel (models/attention_tpu.py), the mask in the parts each takes."""
    batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    parts = mask if isinstance(mask, SegmentMask) else SegmentMask()
    segments = None
    if parts.q_segments is not None:  # the kernels mask by segment ids and position themselves
        segments = tuple(jnp.broadcast_to(ids, (batch, length)).astype(jnp.int32)
                         for ids, length in ((parts.q_segments, q_len), (parts.kv_segments, kv_len)))
    if implementation == "splash":
        return attention_tpu.splash(q, k, v, segments, parts.causal, parts.window, parts.windowed, scale)
    # flash has no window: the band enters as `ab`, shared by the rows; a dense mask as it is
    dense = parts.shared(q_len) if isinstance(mask, SegmentMask) else mask
    return attention_tpu.flash(q, k, v, segments, parts.causal, dense, bias, scale)


_COUNTED: contextvars.ContextVar[list | None] = contextvars.ContextVar("attention_pairs", default=None)


@contextlib.contextmanager
def counting_pairs():
    """Records, for each attention call traced inside, (the FLOPs of its two matmuls over every (query, key) pair,
    the same over the pairs its static mask keeps): a model's FLOPs count only the attention its masks keep
    (pretrain/loops/aot.model_flops), whatever the kernel computes."""
    calls: list[tuple[float, float]] = []
    token = _COUNTED.set(calls)
    try:
        yield calls
    finally:
        _COUNTED.reset(token)


def _count(q: jax.Array, k: jax.Array, mask) -> None:
    calls = _COUNTED.get()
    if calls is None:
        return
    batch, q_len, heads, head_dim = q.shape
    kv_len = k.shape[1]
    per_pair = 4.0 * batch * heads * head_dim  # q.k and p.v: a multiply-add each per element of the head
    kept = mask.kept_pairs(q_len, kv_len) if isinstance(mask, SegmentMask) else q_len * kv_len
    calls.append((per_pair * q_len * kv_len, per_pair * kept))


def attention_with_weights(q: jax.Array, k: jax.Array, v: jax.Array,  # [B, L, H, K], [B, S, H, K] x 2
                           mask: jax.Array | SegmentMask | None, bias: jax.Array | None, *, scale: float,
                           dropout: Callable[[jax.Array], jax.Array] | None = None
                           ) -> tuple[jax.Array, jax.Array, jax.Array]:  # [B, L, H, K], [B, H, L, S] x 2
    """The reference, whatever `model.attention` says (the fused kernels keep no [L, S] matrix to return), with
    what it computes on the way: (output, scores, probabilities). scores: scale * q.k + bias before the mask, in
    float32 (TinyBERT distils these); probabilities: the masked softmax in float32, before dropout (MiniLM
    distils these; Hugging Face's output_attentions, outside training)."""
    return _reference(q, k, v, dense_mask(mask, q.shape[1], k.shape[1]), bias, scale, dropout)


def _reference(q, k, v, mask, bias, scale, dropout):
    if scale != 1.0:  # divide, as BERT and Hugging Face do, so that float32 results match theirs bit for bit
        q = q / jnp.asarray(1.0 / scale, q.dtype)
    scores = jnp.einsum("blhk,bshk->bhls", q, k).astype(jnp.float32)  # softmax in float32
    if bias is not None:
        scores = scores + bias.astype(jnp.float32)
    logits = scores if mask is None else jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    weights = probs.astype(q.dtype)
    if dropout is not None:
        weights = dropout(weights)
    return jnp.einsum("bhls,bshk->blhk", weights, v), scores, probs


def platform() -> str:
    """What the computation is compiled for: the devices of the mesh it runs under (an ahead-of-time compile
    for a TPU slice traces on a CPU host), else JAX's default backend."""
    mesh = attention_tpu.current_mesh()
    if isinstance(mesh, jax.sharding.Mesh) and mesh.devices.size:
        return mesh.devices.flat[0].platform
    return jax.default_backend()
