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
- "pallas": the TPU flash-attention kernel written in Pallas (jax.experimental.pallas.ops.tpu): blocks of
  128 queries x 128 keys in VMEM, no [L, S] matrix in HBM for the softmax. Query and key lengths must be
  multiples of 128. A `SegmentMask` (what BERT, GPT without a prefix and T5 build) enters as the kernel's
  own segment ids and causal flag, so no [L, S] mask exists anywhere; a dense mask (prefix LM) and T5's
  bias enter as its additive `ab` input ([B, H, L, S], which the kernel differentiates, so T5's
  relative-position table learns). The kernel has no sliding window: a `SegmentMask`'s window falls back to the
  band as `ab` (segments still as ids), materialised [B, H, L, S] in HBM and computed over every block, so a
  window costs memory and saves no FLOPs; so does ModernBERT's scanned stack, whose mask is dense (the layer's
  kind is traced: select in models/modernbert.py). Under a mesh with more than one device
  it runs per shard (shard_map over the batch axes, heads over `tensor`). Tested on CPU in Pallas' TPU
  interpret mode; compiles for TPU with libtpu (python -m pretrain.tools.aot_compile).
- "auto": the fastest that applies: cuDNN on a GPU in half precision, Pallas on a TPU where the lengths
  allow, XLA elsewhere; the reference wherever attention dropout is active (training with
  `attention_dropout_rate > 0`).

Shapes: B = batch, L = query length, S = key length, H = heads, K = head dim.
"""
from __future__ import annotations

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn", "pallas")
FUSED = ("xla", "cudnn", "pallas")  # none of them can drop attention probabilities out
PALLAS_BLOCK = 128                  # the TPU kernel's tile along queries and keys
PALLAS_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # the kernel's own mask value: finite after scaling


@flax.struct.dataclass
class SegmentMask:
    """A mask kept as what it is made of: a query attends to the keys of its own segment (ids 0 = padding,
    which neither attends nor is attended to; a 0/1 padding mask is the unpacked case; no ids: one segment)
    and, if `causal`, to keys at or before its position only. `dense()` is the [B|1, 1, L, S] bool array
    the reference takes; the fused kernels take the parts: Pallas its segment ids and causal flag (no [L, S]
    matrix anywhere), XLA and cuDNN `is_causal` beside the segments' mask.
    `window` > 0: a sliding window (ModernBERT's local attention): query i attends only to keys j with
    |i - j| <= window, by index in the row (in a packed row, the distance inside the example). XLA takes it as
    `local_window_size` (cuDNN only with `causal`: its window is one-sided); the reference, cuDNN otherwise and
    Pallas (whose kernel has none) as the band in the dense mask or the additive input.
    `band` [1, 1, L, S] bool: one more mask every row shares (a scanned ModernBERT layer's window or none, chosen
    by a traced flag), which Pallas takes as an additive input shared by the rows (no [B, ...] copy)."""
    q_segments: jax.Array | None = None    # [B|1, L] int; None: one segment, no padding
    kv_segments: jax.Array | None = None   # [B|1, S] int; None exactly when q_segments is
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    window: int = flax.struct.field(pytree_node=False, default=0)
    band: jax.Array | None = None          # [1, 1, L, S] bool, True = may attend

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
        """[1, 1, L, L] bool: what every row's mask has in common beside the segments and causality (the window and
        the band), or None."""
        window = window_mask(length, self.window)
        if self.band is None or window is None:
            return self.band if window is None else window
        return self.band & window


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


def pallas_fits(q_len: int, kv_len: int, head_dim: int) -> bool:
    """Whether the TPU kernel's tiling takes these shapes."""
    return q_len % PALLAS_BLOCK == 0 and kv_len % PALLAS_BLOCK == 0 and (
        head_dim <= PALLAS_BLOCK or head_dim % PALLAS_BLOCK == 0)


def choose(implementation: str, dtype, head_dim: int, dropout_active: bool, q_len: int = 0, kv_len: int = 0) -> str:
    """`model.attention` -> the implementation that runs for this call (resolved at trace time)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if dropout_active:
        if implementation in FUSED:
            raise ValueError(f"attention={implementation!r} cannot drop attention probabilities out: set "
                             "attention_dropout_rate=0 or attention='auto' (which uses the reference einsum then)")
        return "einsum"
    fits = pallas_fits(q_len, kv_len, head_dim)
    if implementation == "pallas" and not fits:
        raise ValueError(f"attention='pallas' tiles queries and keys by {PALLAS_BLOCK}: lengths {q_len} x {kv_len} "
                         f"(head dim {head_dim}) do not divide; use attention='auto' (XLA's kernel for such shapes)")
    if implementation != "auto":
        return implementation
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    on = platform()
    if on == "gpu" and half and head_dim % 8 == 0 and head_dim <= 128:
        return "cudnn"
    if on == "tpu" and fits:
        return "pallas"
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
    implementation = choose(implementation, q.dtype, q.shape[-1], dropout is not None, q.shape[1], k.shape[1])
    if implementation == "pallas":
        return _pallas(q, k, v, mask, bias, scale)
    if implementation == "einsum":
        return _reference(q, k, v, dense_mask(mask, q.shape[1], k.shape[1]), bias, scale, dropout)[0]
    self_attention = isinstance(mask, SegmentMask) and q.shape[1] == k.shape[1]
    is_causal = self_attention and mask.causal
    # cuDNN's window reaches only to the left of the query (JAX raises for a right one without is_causal): a
    # two-sided band (ModernBERT's) stays in the dense mask, which JAX hands cuDNN as an additive bias
    window = mask.window if self_attention and (implementation == "xla" or is_causal) else 0
    if is_causal or window:  # the kernel's own causal and sliding-window masking, the segments' mask beside it
        mask = mask.replace(causal=False, window=0 if window else mask.window)
    if bias is not None:
        bias = bias.astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=dense_mask(mask, q.shape[1], k.shape[1]),
                                        scale=scale, is_causal=is_causal,
                                        local_window_size=(window, window) if window else None,
                                        implementation=implementation).astype(q.dtype)


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


def _pallas(q, k, v, mask, bias, scale):
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
    batch, q_len, heads, _ = q.shape
    kv_len = k.shape[1]
    operands = {"q": q, "k": k, "v": v}  # q, k, v: [B, L|S, H, K]
    causal = isinstance(mask, SegmentMask) and mask.causal
    if isinstance(mask, SegmentMask):  # the kernel masks by segment ids and position itself
        if mask.q_segments is not None:
            operands["q_segments"] = jnp.broadcast_to(mask.q_segments, (batch, q_len)).astype(jnp.int32)
            operands["kv_segments"] = jnp.broadcast_to(mask.kv_segments, (batch, kv_len)).astype(jnp.int32)
        mask = mask.shared(q_len)  # no window in the kernel: the band enters as `ab` (below), shared by the rows
    ab = None  # the kernel adds `ab` to the unscaled q.k and then scales: the bias goes in divided by the scale
    if bias is not None:
        ab = bias.astype(jnp.float32) / scale
    if mask is not None:
        # A query that may attend to nothing (padding) attends to everything instead: its output is unused
        # either way, and a fully masked row turns the kernel's backward pass into NaNs.
        mask = mask | ~mask.any(axis=-1, keepdims=True)
        blocked = jnp.where(mask, 0.0, PALLAS_MASKED)  # [B|1, 1, L, S]
        ab = blocked if ab is None else ab + blocked
    shared_ab = ab is not None and ab.shape[0] == 1 and batch > 1  # T5's position bias: one for every row
    if ab is not None:  # [B, H, L, S], or [1, H, L, S] when every row shares it
        operands["ab"] = jnp.broadcast_to(ab, (ab.shape[0], heads, q_len, kv_len)).astype(q.dtype)

    def flash(operands):  # [B, L, H, K] <-> the kernel's [B, H, L, K]
        segment_ids = None
        if "q_segments" in operands:
            segment_ids = tpu_flash.SegmentIds(q=operands["q_segments"], kv=operands["kv_segments"])
        q, k, v = (operands[name].transpose(0, 2, 1, 3) for name in "qkv")
        out = tpu_flash.flash_attention(q, k, v, ab=operands.get("ab"), segment_ids=segment_ids, causal=causal,
                                        sm_scale=scale)
        return out.transpose(0, 2, 1, 3).astype(q.dtype)

    def kernel(operands):
        if not shared_ab:
            return flash(operands)
        # The kernel takes `ab` as [B, H, L, S]: mapped over the rows (Pallas adds them to the kernel's grid), it
        # reads a bias every row shares as it is, with no copy of it per row.
        rows = {name: value[:, None] for name, value in operands.items() if name != "ab"}
        return jax.vmap(lambda row, ab: flash({**row, "ab": ab})[0], in_axes=(0, None))(rows, operands["ab"])

    mesh = _current_mesh()
    if mesh is None or mesh.size == 1 or not {"data", "fsdp", "tensor"} <= set(mesh.axis_names):
        return kernel(operands)
    # XLA cannot partition a custom kernel: run it on each device's rows and heads (where they divide: the
    # initializer traces one example)
    from jax.sharding import PartitionSpec as P
    split_rows = ("data", "fsdp") if batch % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0 else None
    split_heads = "tensor" if heads % mesh.shape["tensor"] == 0 else None
    rows = P(split_rows, None, split_heads, None)  # q, k, v, out: [B, L, H, K]
    specs = {"q": rows, "k": rows, "v": rows, "q_segments": P(split_rows, None), "kv_segments": P(split_rows, None),
             "ab": P(None if shared_ab else split_rows, split_heads, None, None)}  # segments [B, L|S], ab [B|1, H, L, S]
    specs = {name: specs[name] for name in operands}
    return jax.shard_map(kernel, mesh=mesh, in_specs=(specs,), out_specs=rows, check_vma=False)(operands)


def platform() -> str:
    """What the computation is compiled for: the devices of the mesh it runs under (an ahead-of-time compile
    for a TPU slice traces on a CPU host), else JAX's default backend."""
    mesh = _current_mesh()
    if isinstance(mesh, jax.sharding.Mesh) and mesh.devices.size:
        return mesh.devices.flat[0].platform
    return jax.default_backend()


def _current_mesh():
    """The mesh the loops enter (`with mesh:`, a concrete Mesh: the devices say the platform), else the abstract
    mesh the train step traces under (pretrain/training/train_state.jit_train_step), else None."""
    import warnings
    with warnings.catch_warnings():  # the loops still enter meshes the pre-`jax.set_mesh` way
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.interpreters import pxla
        physical = pxla.thread_resources.env.physical_mesh
    if not physical.empty:
        return physical
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh
