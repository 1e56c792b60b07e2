"""``AlibiBias``: linear attention biases (ALiBi)."""

from __future__ import annotations

import torch

from posenc import _validate
from posenc.core import alibi as core_alibi
from posenc.functional import alibi as functional_alibi
from posenc.nn._tables import TableModule

__all__ = ["AlibiBias"]


class AlibiBias(TableModule):
    """ALiBi (Press et al. 2022, "Train Short, Test Long"): a per-head linear bias on attention logits.

    ``forward(q_positions, k_positions)`` returns ``-m_h * (q_i - k_j)`` (``|q_i - k_j|`` with
    ``symmetric=True``), shape ``(H, S, S_k)`` for 1-D positions or ``(B, H, S, S_k)`` for per-row
    positions; build it once per forward and share it across layers (or pass the module to
    :func:`posenc.attention`).  The slopes follow the paper's rule for any head count and live in a
    non-persistent float64 buffer.

    Args:
        num_heads: query heads ``H``.
        symmetric: bias by ``|q_i - k_j|`` (bidirectional attention) instead of ``q_i - k_j``
            (causal attention, where later keys are masked anyway).
        device: device of the slopes.

    Examples:
        >>> AlibiBias(2)(torch.arange(3)).shape
        torch.Size([2, 3, 3])
    """

    _table_buffers = ("slopes",)
    _ignored_state_keys = ("alibi", "alibi_bias", "bias")

    def __init__(self, num_heads: int, *, symmetric: bool = False, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
        if not isinstance(symmetric, bool):
            raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
        self.symmetric = symmetric
        self.register_buffer("slopes", torch.empty(self.num_heads, dtype=torch.float64, device=device), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """(Re)compute the slopes, e.g. after meta-device construction and ``to_empty``."""
        if self.slopes.device.type != "meta":
            with torch.no_grad():
                self.slopes.copy_(torch.tensor(core_alibi.alibi_slopes(self.num_heads), dtype=torch.float64))

    def forward(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Bias for queries at ``q_positions`` and keys at ``k_positions`` (default: the same)."""
        k_positions = q_positions if k_positions is None else k_positions
        return functional_alibi.alibi_bias(q_positions, k_positions, self.slopes, symmetric=self.symmetric, dtype=dtype)

    def extra_repr(self) -> str:
        return f"{self.num_heads}, symmetric={self.symmetric}"
