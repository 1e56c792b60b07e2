"""The RoPE context-extension rules as the lab applies them, keyed by the names of
:data:`posenc.core.rope.SCALINGS` (the one registry of scaling rules).

A lab model is trained on ``train_len`` positions and read (or fine-tuned) at ``factor`` times
that; each builder gives the rule for that stretch.  The registry test demands that every
registered rule is either built here or listed in :data:`NOT_IN_LAB` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from posenc.core.rope import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    RopeScaling,
    YarnScaling,
)

__all__ = ["LAB_RULES", "NOT_IN_LAB", "lab_rule"]


def _longrope(factor: float, train_len: int, head_dim: int) -> LongRopeScaling:
    """LongRoPE-style per-pair factors (Ding et al. 2024) without LongRoPE's search: pair ``i`` of
    ``P`` is divided by ``factor^(i / (P - 1))``, from 1 for the fastest pair to ``factor`` for the
    slowest; the original frequencies up to ``train_len``."""
    pairs = head_dim // 2
    long = tuple(factor ** (i / max(1, pairs - 1)) for i in range(pairs))
    return LongRopeScaling((1.0,) * pairs, long, train_len, factor=factor)


#: rule name -> ``build(factor, train_len, head_dim)``.  Dynamic NTK stretches the base with the
#: length it reads, so it is built with factor 1 (transformers' rule at its neutral setting).
LAB_RULES: dict[str, Callable[[float, int, int], RopeScaling]] = {
    "linear": lambda factor, train_len, head_dim: LinearScaling(factor),
    "ntk": lambda factor, train_len, head_dim: NTKScaling(factor),
    "dynamic": lambda factor, train_len, head_dim: DynamicNTKScaling(1.0, train_len),
    "yarn": lambda factor, train_len, head_dim: YarnScaling(factor, train_len),
    "llama3": lambda factor, train_len, head_dim: Llama3Scaling(factor, train_len),
    "longrope": _longrope,
}

#: Registered rules the lab does not run, and why.
NOT_IN_LAB: dict[str, str] = {
    "proportional": "it rotates part of every head at the whole head's frequencies, a choice of architecture made "
                    "before training, not a rule that extends a trained model's context",
}


def lab_rule(name: str, factor: float, train_len: int, head_dim: int) -> RopeScaling:
    """The rule ``name`` stretching a context of ``train_len`` positions by ``factor``.

    Examples:
        >>> lab_rule("linear", 4.0, 32, 16)
        LinearScaling(factor=4.0)
    """
    build = LAB_RULES.get(name)
    if build is None:
        raise ValueError(f"unknown rope rule {name!r}; choose from {', '.join(LAB_RULES)}")
    return build(factor, train_len, head_dim)
