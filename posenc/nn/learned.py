"""``LearnedPositionalEmbedding``: a trainable table of absolute positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posenc._torch.checks import check_embeddings, check_float_dtype, check_position_args, check_same_device
from posenc._torch.rows import position_range
from posenc.core.sinusoidal import check_learned_args
from posenc.functional.sinusoidal import sinusoidal_table

__all__ = ["LearnedPositionalEmbedding"]



class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned embedding of each absolute position to ``x`` (BERT, GPT-2; seed 002's option 3).

    Unlike a fixed encoding, a learned table cannot represent positions it has no row for: a position
    ``>= num_positions`` raises :class:`ValueError` (never an index error or a device assert).

    Args:
        num_positions: rows of the table (the largest usable position is ``num_positions - 1``).
        dim: number of features ``D``.
        init: ``"normal"`` (N(0, 0.02^2), as BERT and GPT-2), ``"sinusoidal"`` (start from the exact
            sinusoidal table, as suggested in Vaswani et al. 2017, section 3.5) or ``"zeros"``.
        padding_idx: as in :class:`torch.nn.Embedding`: that row is zero and gets no gradient.
        device: device of the weight.
        dtype: dtype of the weight.

    Shape:
        ``x``: ``(B, S, D)`` or ``(S, D)``; ``positions``: ``(S,)`` or ``(B, S)``; output like ``x``.

    Examples:
        >>> emb = LearnedPositionalEmbedding(10, 4, init="sinusoidal")
        >>> emb(torch.zeros(1, 2, 4)).detach()
        tensor([[[0.0000, 1.0000, 0.0000, 1.0000],
                 [0.8415, 0.5403, 0.0100, 0.9999]]])
    """

    #: Added to the token embeddings, not applied inside attention (see :func:`posenc.attention`).
    adds_to_embeddings = True

    def __init__(
        self,
        num_positions: int,
        dim: int,
        *,
        init: str = "normal",
        padding_idx: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_positions, self.dim, self.init, self.padding_idx = check_learned_args(
            num_positions, dim, init, padding_idx)
        if dtype is not None:
            check_float_dtype("dtype", dtype)
        self.weight = nn.Parameter(torch.empty(self.num_positions, self.dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise the weight according to ``init`` (and zero the ``padding_idx`` row)."""
        with torch.no_grad():
            if self.init == "normal":
                nn.init.normal_(self.weight, std=0.02)
            elif self.init == "zeros":
                nn.init.zeros_(self.weight)
            elif self.weight.device.type != "meta":
                self.weight.copy_(sinusoidal_table(self.num_positions, self.dim, dtype=torch.float64))
            if self.padding_idx is not None:
                self.weight[self.padding_idx].zero_()

    def forward(self, x: torch.Tensor, *, positions: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """Return ``x + weight[positions]`` (``positions`` default ``offset + arange(S)``)."""
        check_embeddings(x, self.dim)
        check_same_device("x", x, "the weight", self.weight.device)
        seq_len = x.shape[-2]
        positions, offset = check_position_args(positions, offset, seq_len, x.shape[0] if x.dim() == 3 else None, x.device)
        if positions is None:
            if offset < 0 or offset + seq_len > self.num_positions:
                raise ValueError(
                    f"positions {offset}..{offset + seq_len - 1} exceed the learned table: num_positions="
                    f"{self.num_positions}; build the module with num_positions >= {offset + seq_len}"
                )
            if self.padding_idx is None or not offset <= self.padding_idx < offset + seq_len:
                return x + self.weight[offset : offset + seq_len].to(x.dtype)
            positions = torch.arange(offset, offset + seq_len, device=self.weight.device)   # keeps padding out of training
        elif positions.numel() and not positions.is_meta and not torch.compiler.is_compiling():
            lo, hi = position_range(positions)
            if lo < 0 or hi >= self.num_positions:
                raise ValueError(
                    f"positions must lie in [0, num_positions={self.num_positions}), got values in [{lo}, {hi}]; "
                    f"build the module with num_positions >= {hi + 1}"
                )
        pe = F.embedding(positions, self.weight, padding_idx=self.padding_idx)   # (..., S, D)
        return x + pe.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_positions}, {self.dim}, init={self.init!r}, padding_idx={self.padding_idx}"
