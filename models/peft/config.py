"""The one frozen `PeftConfig` of a fine-tuning run (it travels beside the model config, to where PEFT is attached:
models/peft/model.py), the names of the parameters the methods create, and the check of a method against a model's
sizes."""
from __future__ import annotations

import dataclasses

from models.errors import ModelInputError
from models.peft.lora import LoraSpec
from models.peft.methods import PEFT_METHODS

PLACEMENTS = ("houlsby", "pfeiffer")
LORA_TARGETS = ("query", "key", "value", "out", "intermediate", "output")  # attention and MLP projections
# Parameter names that only PEFT creates: whatever lies under one of them trains (and is all a PEFT
# checkpoint stores, with the task head).
PEFT_NAMES = ("lora_a", "lora_b", "attention_adapter", "cross_attention_adapter", "mlp_adapter", "prefix_encoder",
              "prompt")


@dataclasses.dataclass(frozen=True)
class PeftConfig:
    method: str = "none"                       # a registered method (models/peft/methods.py PEFT_METHODS)
    adapter_size: int = 64                     # m: the bottleneck width
    adapter_placement: str = "houlsby"         # houlsby: after attention and the FFN | pfeiffer: after the FFN
    lora_rank: int = 8                         # r
    lora_alpha: float = 8.0                    # the update is scaled by alpha / r
    lora_dropout: float = 0.0                  # on the low-rank branch's input
    lora_targets: tuple[str, ...] = ("query", "value")
    prefix_length: int = 20                    # P key/value pairs per layer
    prefix_hidden_size: int = 512              # the reparameterization MLP's width; 0 = train the table itself
    prompt_length: int = 20                    # P input embeddings

    def __post_init__(self):
        checks = (("method", self.method, PEFT_METHODS.names()),
                  ("adapter_placement", self.adapter_placement, PLACEMENTS))
        for name, value, allowed in checks:
            if value not in allowed:
                raise ModelInputError(f"peft.{name}={value!r} is not one of {', '.join(allowed)}")
        unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if unknown or not self.lora_targets:
            raise ModelInputError(f"peft.lora_targets={self.lora_targets!r}: each must be one of "
                                  f"{', '.join(LORA_TARGETS)}")
        for name in ("adapter_size", "lora_rank", "prefix_length", "prompt_length"):
            if getattr(self, name) < 1:
                raise ModelInputError(f"peft.{name}={getattr(self, name)} must be a positive integer")

    def lora_for(self, name: str) -> LoraSpec | None:
        """The low-rank update of the projection `name` (for LoRA's interceptor), or None where it stays alone."""
        if name not in self.lora_targets:
            return None
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout)

    @property
    def virtual_positions(self) -> int:
        """Positions the method takes in front of the input: P for prefix-tuning (a Hugging Face model given
        the prefix as past keys and values numbers the tokens from P) and for prompt tuning (P virtual tokens)."""
        return PEFT_METHODS.get(self.method).virtual_positions(self)


NONE = PeftConfig()  # no PEFT method: full fine-tuning


def check_fits(peft: PeftConfig, dims) -> None:
    """Errors for a PEFT config this model cannot take (dims: its models.config_base.Dims): the method's own."""
    PEFT_METHODS.get(peft.method).fits(peft, dims)


def is_peft_path(names: tuple[str, ...] | list[str]) -> bool:
    """Whether a parameter at this path (its dict keys) belongs to a PEFT method."""
    return any(name in PEFT_NAMES for name in names)
