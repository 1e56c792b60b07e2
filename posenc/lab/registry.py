"""Registry of encodings a :class:`~posenc.lab.TinyTransformer` can use (``posenc list``)."""

from __future__ import annotations

import dataclasses

__all__ = ["ENCODINGS", "EncodingInfo", "list_encodings"]


@dataclasses.dataclass(frozen=True)
class EncodingInfo:
    """One registered encoding: its name, family and a one-line description with the paper."""

    name: str
    family: str
    description: str


ENCODINGS: dict[str, EncodingInfo] = {
    info.name: info
    for info in (
        EncodingInfo("none", "none", "no positional information (attention is permutation-equivariant)"),
        EncodingInfo("sinusoidal", "additive", "fixed sin/cos table added to the embeddings (Vaswani et al. 2017)"),
        EncodingInfo("learned", "additive", "trainable table of absolute positions added to the embeddings (BERT, GPT-2)"),
        EncodingInfo("rope", "rotary", "rotary position embedding of q and k (Su et al. 2021)"),
        EncodingInfo("alibi", "bias", "linear per-head bias on the logits; symmetric when bidirectional (Press et al. 2022)"),
        EncodingInfo("t5", "bias", "learned bucketed relative-position bias, shared by all layers (Raffel et al. 2020)"),
    )
}


def list_encodings() -> list[EncodingInfo]:
    """The registered encodings, in a fixed order.

    Examples:
        >>> [e.name for e in list_encodings()]
        ['none', 'sinusoidal', 'learned', 'rope', 'alibi', 't5']
    """
    return list(ENCODINGS.values())
