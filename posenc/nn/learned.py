"""``LearnedPositionalEmbedding``: a trainable table of absolute positions."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc import _validate
from posenc._deprecate import UNSET, renamed
from posenc._torch.angles import has_float64, host_round
from posenc._torch.checks import (
    check_embeddings,
    check_float_dtype,
    check_position_args,
    check_same_device,
    embedding_seq_axis,
)
from posenc._torch.rows import position_range
from posenc.core import sinusoidal as core_sinusoidal
from posenc.core.sinusoidal import check_learned_args
from posenc.functional.resize import resize_position_embedding
from posenc.functional.sinusoidal import sinusoidal_table

__all__ = ["LearnedPositionalEmbedding"]


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned embedding of each absolute position to ``x`` (BERT, GPT-2).

    Unlike a fixed encoding, a learned table cannot represent positions it has no row for: a position
    ``>= max_seq_len`` raises :class:`ValueError` (never an index error or a device assert).

    Args:
        max_seq_len: rows of the table (the largest usable position is ``max_seq_len - 1``); required.
        dim: number of features ``D``; required.
        init: ``"normal"`` (N(0, 0.02^2), as BERT and GPT-2), ``"sinusoidal"`` (start from the exact
            sinusoidal table, as suggested in Vaswani et al. 2017, section 3.5) or ``"zeros"``.
        padding_idx: as in :class:`torch.nn.Embedding`: that row is zero and gets no gradient.
        device: device of the weight.
        dtype: dtype of the weight.
        num_positions: old name of ``max_seq_len`` (deprecated).

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
        max_seq_len: int | None = None,
        dim: int | None = None,
        *,
        init: str = "normal",
        padding_idx: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        num_positions: Any = UNSET,
    ) -> None:
        super().__init__()
        max_seq_len = renamed("LearnedPositionalEmbedding", "num_positions", "max_seq_len", num_positions,
                              max_seq_len, None)
        self.max_seq_len, self.dim, self.init, self.padding_idx = check_learned_args(
            max_seq_len, dim, init, padding_idx)
        if dtype is not None:
            check_float_dtype("dtype", dtype)
        self.weight = nn.Parameter(torch.empty(self.max_seq_len, self.dim, device=device, dtype=dtype))
        self.reset_parameters()

    @property
    def num_positions(self) -> int:
        """Old name of :attr:`max_seq_len` (deprecated)."""
        warnings.warn("LearnedPositionalEmbedding.num_positions is deprecated and will be removed in the next "
                      "release; read max_seq_len instead", DeprecationWarning, stacklevel=2)
        return self.max_seq_len

    def reset_parameters(self) -> None:
        """Initialise the weight according to ``init`` (and zero the ``padding_idx`` row)."""
        with torch.no_grad():
            if self.init == "normal":
                nn.init.normal_(self.weight, std=0.02)
            elif self.init == "zeros":
                nn.init.zeros_(self.weight)
            elif self.weight.device.type != "meta" and not has_float64(self.weight.device):
                # a device without float64: the exact table rounded once on the host (NumPy), then moved
                exact = core_sinusoidal.table(np.arange(self.max_seq_len), self.dim)
                self.weight.copy_(host_round(exact, self.weight.dtype))
            elif self.weight.device.type != "meta":
                self.weight.copy_(sinusoidal_table(self.max_seq_len, self.dim, dtype=torch.float64))
            if self.padding_idx is not None:
                self.weight[self.padding_idx].zero_()

    def forward(self, x: torch.Tensor, *, positions: torch.Tensor | None = None, offset: int = 0,
                seq_dim: int = -2) -> torch.Tensor:
        """Return ``x + weight[positions]`` (``positions`` default ``offset + arange(S)``).

        ``x`` is ``(B, S, D)`` or ``(S, D)``, or ``(S, B, D)`` with ``seq_dim=0`` (``nn.Transformer``'s default
        layout); ``positions`` is ``(S,)`` or ``(B, S)`` either way."""
        check_embeddings(x, self.dim)
        check_same_device("x", x, "the weight", self.weight.device)
        sd = embedding_seq_axis(x, seq_dim)
        if sd == 0 and x.dim() == 3:                                        # (S, B, D): the same rows per batch
            return self.forward(x.transpose(0, 1), positions=positions, offset=offset).transpose(0, 1)
        seq_len = x.shape[-2]
        positions, offset = check_position_args(positions, offset, seq_len, x.shape[0] if x.dim() == 3 else None, x.device)
        if positions is None:
            if offset < 0 or offset + seq_len > self.max_seq_len:
                raise ValueError(
                    f"positions {offset}..{offset + seq_len - 1} exceed the learned table: max_seq_len="
                    f"{self.max_seq_len}; build the module with max_seq_len >= {offset + seq_len}"
                )
            if self.padding_idx is None or not offset <= self.padding_idx < offset + seq_len:
                return x + self.weight[offset : offset + seq_len].to(x.dtype)
            positions = torch.arange(offset, offset + seq_len, device=self.weight.device)   # keeps padding out of training
        elif positions.numel() and not positions.is_meta and not torch.compiler.is_compiling():
            lo, hi = position_range(positions)
            if lo < 0 or hi >= self.max_seq_len:
                raise ValueError(
                    f"positions must lie in [0, max_seq_len={self.max_seq_len}), got values in [{lo}, {hi}]; "
                    f"build the module with max_seq_len >= {hi + 1}"
                )
        pe = F.embedding(positions, self.weight, padding_idx=self.padding_idx)   # (..., S, D)
        return x + pe.to(x.dtype)

    def resize(
        self, max_seq_len: int | None = None, *, mode: str = "cubic", antialias: bool = True,
        num_positions: Any = UNSET,
    ) -> LearnedPositionalEmbedding:
        """A new module whose table is this one resampled to ``max_seq_len`` rows.

        The rows are resampled as a curve along the position axis by
        :func:`~posenc.functional.resize.resize_position_embedding` (computed in float32, or float64
        for a float64 weight, and rounded once to the weight's dtype), as when a model trained on
        short sequences is extended to longer ones.  ``self`` is left unchanged (an optimizer holding
        its weight keeps working on it): assign the result, ``model.pos = model.pos.resize(1024)``,
        and hand the new parameters to the optimizer.  The new module has the same ``dim``, ``init``,
        ``padding_idx``, dtype, device, ``requires_grad`` and training mode; its weight is a new leaf
        parameter (to backpropagate through the resize, call the function on ``weight`` instead).
        ``init`` is kept for :meth:`reset_parameters`, which draws a fresh table of the new size.

        With a ``padding_idx``, rows ``0..padding_idx`` are kept unchanged at their indices (the
        padding row stays zero) and only the positions after it are resampled, as in the fairseq and
        RoBERTa convention where real positions start at ``padding_idx + 1``.

        Args:
            max_seq_len: rows of the new table (more than ``padding_idx + 1``); required.
            mode: ``"cubic"`` (default), ``"linear"``, ``"nearest"``, ``"nearest-exact"`` or ``"area"``.
            antialias: low-pass filter when shrinking (``"cubic"``/``"linear"`` only; pass ``False``
                with the other modes).
            num_positions: old name of ``max_seq_len`` (deprecated).

        Returns:
            A new :class:`LearnedPositionalEmbedding` with ``max_seq_len`` rows.

        Raises:
            TypeError: if ``max_seq_len`` is not an int.
            ValueError: if ``max_seq_len < 1``, ``mode`` is unknown, or no position would remain
                after the ``padding_idx`` row (in the new or the current table).

        Examples:
            >>> emb = LearnedPositionalEmbedding(4, 1, init="zeros")
            >>> with torch.no_grad():
            ...     _ = emb.weight.copy_(torch.arange(4.0).view(4, 1))
            >>> emb.resize(8, mode="linear", antialias=False).weight.detach().view(-1)
            tensor([0.0000, 0.2500, 0.7500, 1.2500, 1.7500, 2.2500, 2.7500, 3.0000])
        """
        max_seq_len = renamed("LearnedPositionalEmbedding.resize", "num_positions", "max_seq_len", num_positions,
                              max_seq_len, None)
        if max_seq_len is None:
            raise TypeError("LearnedPositionalEmbedding.resize needs max_seq_len, the rows of the new table")
        max_seq_len = _validate.check_int("max_seq_len", max_seq_len, minimum=1)
        kept = 0 if self.padding_idx is None else self.padding_idx + 1         # rows 0..padding_idx stay
        if kept and (max_seq_len <= kept or self.max_seq_len <= kept):
            raise ValueError(
                f"resize keeps rows 0..padding_idx={self.padding_idx} and resamples the positions after them, "
                f"so both tables need more than {kept} rows; got max_seq_len={max_seq_len} "
                f"(current {self.max_seq_len}); pass max_seq_len > {kept}, or resize the weight with "
                f"resize_position_embedding(weight, n, prefix_tokens=...) and build a module without padding_idx"
            )
        with torch.no_grad():
            weight = resize_position_embedding(
                self.weight, max_seq_len - kept, prefix_tokens=kept, mode=mode, antialias=antialias)
            if weight is self.weight:                                            # same size: still a copy
                weight = weight.clone()
        new = type(self)(max_seq_len, self.dim, init=self.init, padding_idx=self.padding_idx,
                         device="meta", dtype=self.weight.dtype)                 # no init work, no RNG draw
        new.weight = nn.Parameter(weight, requires_grad=self.weight.requires_grad)
        return new.train(self.training)

    def extra_repr(self) -> str:
        return f"{self.max_seq_len}, {self.dim}, init={self.init!r}, padding_idx={self.padding_idx}"
