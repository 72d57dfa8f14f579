"""Addition, for the decoder-only model: the prompt ``"123+4567="``, the answer ``"4690"``.

Each operand has ``1..max_digits`` digits (the number of digits drawn uniformly, then
the value, so short and long numbers are equally common). A tenth of the sums, chosen by
a hash of ``"a+b"``, is held out. The model reads ``BOS 1 2 3 + 4 5 6 7 =`` and learns to
continue with ``4 6 9 0 EOS``; only the answer is scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from annotated_transformer.data.task import Pair, Task, draw_pairs, randint
from annotated_transformer.data.vocab import SPECIALS, Vocabulary


def count_carries(a: int, b: int) -> int:
    """How many digit positions of ``a + b`` produce a carry (``95 + 7``: 2)."""
    carries = carry = 0
    while a or b:
        carry = (a % 10 + b % 10 + carry) // 10
        carries += carry
        a, b = a // 10, b // 10
    return carries


@dataclass(frozen=True)
class AdditionTask(Task):
    """``a+b=`` -> ``a + b`` in decimal, operands of ``1..max_digits`` digits."""

    max_digits: int = 3
    name = "addition"
    decoder_only = True
    vocab: Vocabulary = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.max_digits <= 18:
            raise ValueError(f"max_digits must be in 1..18, got {self.max_digits}")
        object.__setattr__(self, "vocab", Vocabulary(SPECIALS + tuple("+0123456789=")))

    def operand(self, generator: torch.Generator) -> int:
        digits = randint(1, self.max_digits, generator)
        return randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1, generator)

    def draw(self, generator: torch.Generator) -> Pair:
        a, b = self.operand(generator), self.operand(generator)
        return f"{a}+{b}=", str(a + b)

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        return draw_pairs(self.draw, count, generator, held_out)

    def spec(self) -> dict:
        return {"task": self.name, "max_digits": self.max_digits}

    @property
    def max_source_len(self) -> int:
        return 2 * self.max_digits + 3  # BOS a + b =

    @property
    def max_target_len(self) -> int:
        return self.max_digits + 2  # the sum has at most one more digit, then EOS
