"""A model's position schedule with torch encodings: one :class:`~posenc.RotaryEmbedding` per
distinct rotary configuration, shared by the layers that use it."""

from __future__ import annotations

from typing import Any

import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch.engine_choice import engine_from_backend
from posenc.core.schedule import PositionSchedule, RopeSpec
from posenc.nn.rotary import RotaryEmbedding

__all__ = ["schedule_from_hf"]


def schedule_from_hf(
    config: Any,
    *,
    max_seq_len: int = 4096,
    engine: str = "auto",
    backend: str = UNSET,
    device: torch.device | str | None = None,
) -> PositionSchedule:
    """:meth:`PositionSchedule.from_hf <posenc.core.schedule.PositionSchedule.from_hf>` with torch
    :class:`~posenc.RotaryEmbedding` modules: pass ``schedule[i]`` to
    ``posenc.attention(q, k, v, layer=schedule[i], causal=True)``.

    Layers with the same rotary configuration share one module (Gemma 3: one for the local layers,
    one for the global ones); NoPE layers have ``encoding=None``.

    Args:
        config: a ``transformers`` ``PretrainedConfig`` or a ``config.json`` dict.
        max_seq_len: rows of each module's table (longer positions are computed exactly).
        engine: rotation engine of the modules (see :class:`~posenc.RotaryEmbedding`).
        backend: the old name of ``engine`` (deprecated; it still works for now).
        device: where the tables live.

    Raises:
        ValueError: a missing, wrong or contradictory config field, named.

    Examples:
        >>> s = schedule_from_hf({"model_type": "cohere2", "num_hidden_layers": 4, "hidden_size": 64,
        ...     "num_attention_heads": 4, "sliding_window": 32, "rope_theta": 10000.0}, max_seq_len=64)
        >>> [type(e.encoding).__name__ for e in s], [e.window for e in s]
        (['RotaryEmbedding', 'RotaryEmbedding', 'RotaryEmbedding', 'NoneType'], [32, 32, 32, None])
    """
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("schedule_from_hf", backend, engine)
    max_seq_len = _validate.check_int("max_seq_len", max_seq_len, minimum=1)

    def build(spec: RopeSpec) -> RotaryEmbedding:
        return RotaryEmbedding(spec.dim, max_seq_len=max_seq_len, base=spec.base, layout=spec.layout,
                               scaling=spec.scaling, engine=engine, device=device)
    return PositionSchedule.from_hf(config, encodings=build)
