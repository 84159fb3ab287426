"""The one frozen `PeftConfig` a model config carries (its `peft` field, models/config_base.py), the names of the
parameters the methods create, and the checks of a method against a model's sizes."""
from __future__ import annotations

import dataclasses

from models.errors import ModelInputError
from models.peft.lora import LoraSpec

METHODS = ("none", "adapters", "lora", "prefix", "prompt")
PLACEMENTS = ("houlsby", "pfeiffer")
LORA_TARGETS = ("query", "key", "value", "out", "intermediate", "output")  # attention and MLP projections
# Parameter names that only PEFT creates: whatever lies under one of them trains (and is all a PEFT
# checkpoint stores, with the task head).
PEFT_NAMES = ("lora_a", "lora_b", "attention_adapter", "cross_attention_adapter", "mlp_adapter", "prefix_encoder",
              "prompt")


@dataclasses.dataclass(frozen=True)
class PeftConfig:
    method: str = "none"                       # one of METHODS
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
        checks = (("method", self.method, METHODS), ("adapter_placement", self.adapter_placement, PLACEMENTS))
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
        """The low-rank update of the projection `name`, or None where LoRA leaves it alone."""
        if self.method != "lora" or name not in self.lora_targets:
            return None
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout)

    @property
    def adapters_after_attention(self) -> bool:
        return self.method == "adapters" and self.adapter_placement == "houlsby"

    @property
    def adapters_after_mlp(self) -> bool:
        return self.method == "adapters"

    @property
    def virtual_positions(self) -> int:
        """Positions the method takes in front of the input: P for prefix-tuning (a Hugging Face model given
        the prefix as past keys and values numbers the tokens from P) and for prompt tuning (P virtual tokens)."""
        return {"prefix": self.prefix_length, "prompt": self.prompt_length}.get(self.method, 0)

    @property
    def virtual_inputs(self) -> int:
        """The embeddings the method puts in front of the input, which join its sequence: P for prompt tuning."""
        return self.prompt_length if self.method == "prompt" else 0


NONE = PeftConfig()  # the model configs' default: no PEFT method


def check_fits(peft: PeftConfig, *, width: int, context: int | None, attention_width: int = 0,
               mlp_width: int = 0) -> None:
    """Errors for a PEFT config this model cannot take. A LoRA rank above the smaller of a projection's input
    and output widths (width D, attention H * K, feed-forward d_ff) is no low-rank update; `context` = the
    model's positions (None: relative positions, no limit)."""
    attention_rank, mlp_rank = min(width, attention_width or width), min(width, mlp_width or width)
    projections = {**dict.fromkeys(("query", "key", "value", "out"), attention_rank),
                   "intermediate": mlp_rank, "output": mlp_rank}
    if peft.method == "lora":
        for target in peft.lora_targets:  # PeftConfig checked the names
            if peft.lora_rank > projections[target]:
                raise ModelInputError(f"peft.lora_rank={peft.lora_rank} exceeds the {target} projection's rank "
                                      f"{projections[target]}: use a rank of at most {projections[target]}")
    if peft.method == "adapters" and peft.adapter_size > width:
        raise ModelInputError(f"peft.adapter_size={peft.adapter_size} is wider than the model ({width}): a bottleneck "
                              f"must be at most {width}")
    if peft.virtual_positions and context is not None and peft.virtual_positions >= context:
        raise ModelInputError(f"peft.{peft.method}_length={peft.virtual_positions} leaves no room in the model's "
                              f"context of {context} positions: use fewer than {context}")


def is_peft_path(names: tuple[str, ...] | list[str]) -> bool:
    """Whether a parameter at this path (its dict keys) belongs to a PEFT method."""
    return any(name in PEFT_NAMES for name in names)
