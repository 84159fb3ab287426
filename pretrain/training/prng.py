"""The key dropout draws from: its PRNG implementation (`config.prng_impl`), made from the run's seed.

threefry (JAX's default) computes every random bit with ~120 integer operations. rbg draws them from XLA's
RngBitGenerator and unsafe_rbg also splits and folds keys that way (MaxText's default on a TPU); XLA cannot
partition that generator, so every chip draws the whole global batch's bits and stores them. hash
(models.ops.HASH) makes each element's bits a counter hash of its index, about 10 integer operations that XLA
partitions and fuses into the masked tensor's kernel. `auto` takes what measured best on each platform
(docs/training.md, "What the TPU programs move"): hash on a TPU (libtpu's estimate of BERT-Base's step: threefry
98.9 ms, rbg 92.4, unsafe_rbg 93.6, hash 77.2); threefry elsewhere: on a CPU a threefry key's masks are that
same hash already (models.ops.keep_mask), so CPU runs keep their losses; a GPU is not measured.
Parameter initialisation keeps threefry whatever the choice: the same seed gives the same initial weights.
"""
from __future__ import annotations

IMPLEMENTATIONS = ("auto", "threefry", "rbg", "unsafe_rbg", "hash")
_AUTO = {"tpu": "hash"}  # every other platform: threefry


def resolve(impl: str, platform: str) -> str:
    """'auto' -> the implementation measured best on `platform` ('tpu', 'gpu', 'cpu'); any other as it is."""
    return _AUTO.get(platform, "threefry") if impl == "auto" else impl


def dropout_key(seed_key, impl: str, platform: str):
    """The dropout key (a jax.Array) of a run whose threefry key is `seed_key`: that key itself for threefry (as
    before the choice existed), else a key of `impl` whose data (two or four 32-bit words) are bits drawn from it.
    JAX is imported here, not above: the config checks import this module before JAX may start."""
    import jax

    from models import ops
    impl = resolve(impl, platform)
    if impl == "threefry":
        return seed_key
    impl = ops.HASH if impl == "hash" else impl
    words = jax.random.key_data(jax.random.key(0, impl=impl)).shape
    return jax.random.wrap_key_data(jax.random.bits(seed_key, words, jax.numpy.uint32), impl=impl)
