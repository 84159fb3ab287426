"""The TPU kernels behind `model.attention` (models/attention.py dispatches here): JAX's Pallas kernels, run per device
under a mesh.

- `flash`: jax.experimental.pallas.ops.tpu.flash_attention. Blocks of 128 queries x 128 keys in VMEM; takes segment
  ids, a causal flag and an additive input `ab` [B, H, L, S] that it differentiates (T5's relative-position bias,
  a dense prefix-LM mask). It computes every block but those above a causal diagonal; a sliding window enters as
  `ab`, so it saves nothing.
- `splash`: jax.experimental.pallas.ops.tpu.splash_attention (MaxText's kernel). Block-sparse: the static mask
  (full, causal, a two-sided window, or both) is cut into 128 x 128 blocks once, at trace time, and the kernel's
  grid visits only blocks that keep something, forward and backward; segment ids mask inside the blocks. No
  additive input: T5's bias and dense masks stay with `flash`. It stores one float32 log-sum-exp per query as the
  backward pass's residual, where `flash` stores `l` and `m` broadcast to 128 lanes.

Both kernels are tested on the CPU in Pallas' TPU interpret mode (tests/helpers/pallas_interpret.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

BLOCK = 128  # both kernels' tile along queries and keys
MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # the kernels' own mask value: finite after scaling


def fits(q_len: int, kv_len: int, head_dim: int) -> bool:
    """Whether the kernels' tiling takes these shapes."""
    return q_len % BLOCK == 0 and kv_len % BLOCK == 0 and (head_dim <= BLOCK or head_dim % BLOCK == 0)


def flash(q: jax.Array, k: jax.Array, v: jax.Array,     # [B, L, H, K], [B, S, H, K] x 2
          segments: tuple[jax.Array, jax.Array] | None,  # [B, L], [B, S] int32 (0 = padding)
          causal: bool,
          mask: jax.Array | None,                        # [B|1, 1, L, S] bool, True = may attend
          bias: jax.Array | None,                        # [B|1, H, L, S] additive
          scale: float) -> jax.Array:                    # [B, L, H, K]
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
    batch, q_len, heads, _ = q.shape
    kv_len = k.shape[1]
    operands = {"q": q, "k": k, "v": v}
    if segments is not None:
        operands["q_segments"], operands["kv_segments"] = segments
    ab = None  # the kernel adds `ab` to the unscaled q.k and then scales: the bias goes in divided by the scale
    if bias is not None:
        ab = bias.astype(jnp.float32) / scale
    if mask is not None:
        # A query that may attend to nothing (padding) attends to everything instead: its output is unused
        # either way, and a fully masked row turns the kernel's backward pass into NaNs.
        mask = mask | ~mask.any(axis=-1, keepdims=True)
        blocked = jnp.where(mask, 0.0, MASKED)  # [B|1, 1, L, S]
        ab = blocked if ab is None else ab + blocked
    shared_ab = ab is not None and ab.shape[0] == 1 and batch > 1  # T5's position bias: one for every row
    if ab is not None:  # [B, H, L, S], or [1, H, L, S] when every row shares it
        operands["ab"] = jnp.broadcast_to(ab, (ab.shape[0], heads, q_len, kv_len)).astype(q.dtype)

    def kernel(operands):  # [B, L, H, K] <-> the kernel's [B, H, L, K]
        segment_ids = None
        if "q_segments" in operands:
            segment_ids = tpu_flash.SegmentIds(q=operands["q_segments"], kv=operands["kv_segments"])
        q, k, v = (operands[name].transpose(0, 2, 1, 3) for name in "qkv")
        out = tpu_flash.flash_attention(q, k, v, ab=operands.get("ab"), segment_ids=segment_ids, causal=causal,
                                        sm_scale=scale)
        return out.transpose(0, 2, 1, 3).astype(q.dtype)

    def rows_sharing_ab(operands):
        if not shared_ab:
            return kernel(operands)
        # The kernel takes `ab` as [B, H, L, S]: mapped over the rows (Pallas adds them to the kernel's grid), it
        # reads a bias every row shares as it is, with no copy of it per row.
        rows = {name: value[:, None] for name, value in operands.items() if name != "ab"}
        return jax.vmap(lambda row, ab: kernel({**row, "ab": ab})[0], in_axes=(0, None))(rows, operands["ab"])

    return per_device(rows_sharing_ab, operands, shared_ab=shared_ab)


def splash(q: jax.Array, k: jax.Array, v: jax.Array,     # [B, L, H, K], [B, S, H, K] x 2
           segments: tuple[jax.Array, jax.Array] | None,  # [B, L], [B, S] int32 (0 = padding)
           causal: bool, window: int,                     # keys j <= i; |i - j| <= window (0: no window)
           windowed: jax.Array | None,                    # [] bool, traced: whether the window applies
           scale: float) -> jax.Array:                    # [B, L, H, K]
    """Padding queries (segment 0) attend to the padding keys within reach: never to nothing, so the kernel's
    softmax stays finite; their outputs are unused, as in every implementation."""
    operands = {"q": q * jnp.asarray(scale, q.dtype), "k": k, "v": v}  # the kernel does not scale
    if segments is not None:
        operands["q_segments"], operands["kv_segments"] = segments

    def kernel(operands, window: int):
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as tpu_splash
        q, k, v = (operands[name].transpose(0, 2, 1, 3) for name in "qkv")  # the kernel's [H, L, K] per row
        attend = _splash_kernel(q.shape[1], q.shape[2], k.shape[2], causal, window)
        if "q_segments" not in operands:
            return jax.vmap(attend)(q, k, v).transpose(0, 2, 1, 3)
        ids = tpu_splash.SegmentIds(q=operands["q_segments"], kv=operands["kv_segments"])
        return jax.vmap(attend)(q, k, v, ids).transpose(0, 2, 1, 3)

    if windowed is None or not window:
        return per_device(functools.partial(kernel, window=window), operands)

    def either(operands):  # a scanned layer's kind is traced: both kernels are compiled, the layer's kind runs
        rest = {name: value for name, value in operands.items() if name != "windowed"}
        return jax.lax.cond(operands["windowed"], functools.partial(kernel, window=window),
                            functools.partial(kernel, window=0), rest)
    return per_device(either, {**operands, "windowed": windowed})


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, q_len: int, kv_len: int, causal: bool, window: int):
    """The kernel for one row [H, L, K] of this static mask (its block structure is worked out here, in NumPy)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as tpu_splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
    shape = (q_len, kv_len)
    if window:
        mask = masks.LocalMask(shape, (window, 0 if causal else window), offset=0)
    elif causal:
        mask = masks.CausalMask(shape)
    else:
        mask = masks.FullMask(shape)
    with jax.ensure_compile_time_eval():  # concrete block tables, never a trace's: the kernel is cached across traces
        return tpu_splash.make_splash_mha(masks.MultiHeadMask([mask] * heads), head_shards=1, q_seq_shards=1,
                                          mask_value=MASKED)


def per_device(kernel, operands: dict[str, jax.Array], shared_ab: bool = False) -> jax.Array:
    """kernel(operands) -> [B, L, H, K], run on each device's rows and heads under a mesh (where they divide: the
    initializer traces one example): XLA cannot partition a custom kernel. operands: q, k, v [B, L|S, H, K]; and
    optionally q_segments, kv_segments [B, L|S]; ab [B|1, H, L, S] (`shared_ab`: [1, ...]); windowed []."""
    mesh = current_mesh()
    if mesh is None or mesh.size == 1 or not {"data", "fsdp", "tensor"} <= set(mesh.axis_names):
        return kernel(operands)
    from jax.sharding import PartitionSpec as P
    batch, _, heads, _ = operands["q"].shape
    split_rows = ("data", "fsdp") if batch % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0 else None
    split_heads = "tensor" if heads % mesh.shape["tensor"] == 0 else None
    rows = P(split_rows, None, split_heads, None)
    specs = {"q": rows, "k": rows, "v": rows, "q_segments": P(split_rows, None), "kv_segments": P(split_rows, None),
             "ab": P(None if shared_ab else split_rows, split_heads, None, None), "windowed": P()}
    specs = {name: specs[name] for name in operands}
    return jax.shard_map(kernel, mesh=mesh, in_specs=(specs,), out_specs=rows, check_vma=False)(operands)


def current_mesh():
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
