"""The PEFT methods as registrations: each method's module registers one `PeftMethod` beside its definition, and
every reader asks the registered method's attributes (what it attaches, what it feeds the model, what trains),
never its name."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from models.errors import ModelInputError
from models.registry import Registry


@dataclasses.dataclass(frozen=True)
class PeftMethod:
    """What a PEFT method does to a base model; `peft` below is a models.peft.PeftConfig, `dims` the model's
    models.config_base.Dims."""
    # (peft) -> a Flax method interceptor installed around the base model's call (LoRA: the projections; adapters:
    # the sub-layer outputs, models/layers.py Sublayers), or None
    interceptor: Callable[[Any], Callable] | None = None
    # (peft, dims, dtype kwargs) -> the module that gives the leading tokens, created in the base model's scope under
    # `tokens_name` (prefix_encoder, prompt); None: no leading tokens
    tokens: Callable[..., Any] | None = None
    tokens_name: str = ""
    feeds: str = ""                       # the base model's argument the tokens fill: leading | keys_values
    length_field: str = ""                # the PeftConfig field that gives P, the positions the tokens take
    check: Callable[[Any, Any], None] | None = None  # (peft, dims) -> raises ModelInputError where it cannot fit
    trains_norms: bool = False            # the layer norms may train with it (config.peft.adapters.train_norms)
    prompt_from_vocabulary: bool = False  # its embeddings may start as vocabulary rows (config.peft.prompt.init)

    def virtual_positions(self, peft) -> int:
        """P: the positions the method takes in front of the input's (0: none)."""
        return getattr(peft, self.length_field) if self.length_field else 0

    def fits(self, peft, dims) -> None:
        """Errors for a method this model cannot take (its rank, bottleneck or virtual tokens against its sizes)."""
        if self.check is not None:
            self.check(peft, dims)
        virtual = self.virtual_positions(peft)
        if virtual and dims.positions is not None and virtual >= dims.positions:
            raise ModelInputError(f"peft.{self.length_field}={virtual} leaves no room in the model's context of "
                                  f"{dims.positions} positions: use fewer than {dims.positions}")


PEFT_METHODS: Registry[PeftMethod] = Registry("PEFT method", key="config.peft.method", error=ModelInputError)
PEFT_METHODS.register("none", PeftMethod())  # full fine-tuning: nothing attached
