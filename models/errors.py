"""The one exception models/ raises for input a person can fix.

A checkpoint directory that is not a model, a weight of the wrong shape, decoding settings out of
range: the message names the thing and the fix. models/ knows nothing of command lines; the entry
points (pretrain/runtime/errors.py) print this as one line and exit 2.
"""


class ModelInputError(ValueError):
    """Bad input to a model, converter or decoder; the message says what to change."""
