"""Positions' range, table-row lookup and broadcasting (not public).

The range of a positions tensor is the only value a rotation may read back from the device.  It is
read at most once per public call, and never when the caller promises the positions lie inside the
table (``assume_valid=True``) or while tracing, where a traceable assertion guards the lookup
instead: no path reads outside a table.
"""

from __future__ import annotations

import torch

#: Up to this many positions are read back whole (one small transfer, no reduction: decode steps).
_READ_WHOLE = 64


def position_range(positions: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a non-empty positions tensor, with one read from the device."""
    if positions.numel() <= _READ_WHOLE:
        values = (positions if positions.dim() == 1 else positions.reshape(-1)).tolist()
        return min(values), max(values)
    lo, hi = torch.stack(torch.aminmax(positions)).tolist()              # one reduction, one transfer
    return lo, hi


def provably_in_table(offset, length, rows: int) -> bool:
    """Whether positions ``offset .. offset + length - 1`` lie in ``[0, rows)`` for sure.

    For tracing: static shapes give a plain answer; symbolic ones (dynamic shapes, ``torch.export``)
    give False unless their constraints prove it, and never add a guard, so one graph serves
    every length (the caller computes such positions instead of reading a table).  Imported here, not
    at module level: sympy and the shape machinery cost a plain ``import posenc`` about a second.
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(offset >= 0) and statically_known_true(offset + length <= rows)


def out_of_table(name: str, lo: int, hi: int, rows: int, fix: str) -> ValueError:
    """The error for positions ``[lo, hi]`` outside a table of ``rows`` rows."""
    return ValueError(f"{name} must lie in [0, {rows}) for this cos/sin table, got values in [{lo}, {hi}]; {fix}")


def guard_in_table(name: str, positions: torch.Tensor, rows: int) -> None:
    """Assert, without reading anything back, that ``positions`` lie in ``[0, rows)``.

    Traceable (``torch.compile``, ``torch.export``): a violation raises at run time (a device-side
    assertion on CUDA) instead of reading outside the table.
    """
    ok = ((positions >= 0) & (positions < rows)).all()
    torch._assert_async(ok, f"{name} must lie in [0, {rows}) for this cos/sin table")


def clamp_in_table(name: str, positions: torch.Tensor, rows: int) -> torch.Tensor:
    """While compiling: assert (:func:`guard_in_table`) that ``positions`` lie in ``[0, rows)`` and
    return them clamped into the table, so the gather that follows never fails: inductor's own
    bounds check of a gather runs inside a parallel CPU loop, where a failure aborts the process,
    while the assertion raises an error.  ``rows`` is a fixed table's length (clamping against a
    symbolic length would guard on the shapes)."""
    guard_in_table(name, positions, rows)
    return positions.clamp(0, rows - 1)


def table_rows(table: torch.Tensor, positions: torch.Tensor | None, offset: int, length: int) -> torch.Tensor:
    """Rows of a ``(P, h)`` table for ``positions`` (``(S,)``/``(B, S)``) or ``offset + arange(S)``.

    The caller has checked (or guarded) the range; the lookup itself is bounds-checked too (an
    ``IndexError`` on CPU, a device-side assertion on CUDA), so it never reads outside the table.
    """
    if positions is None:
        return table.narrow(0, offset, length)
    if positions.dtype not in (torch.int64, torch.int32):
        positions = positions.long()
    try:
        return torch.embedding(table, positions)
    except IndexError:                                                   # a broken assume_valid promise
        raise ValueError(
            f"positions must lie in [0, {table.shape[0]}) for this cos/sin table (they were promised to with "
            f"assume_valid=True); drop the promise to have them checked or computed"
        ) from None


def broadcast_rows(rows: torch.Tensor, ndim: int, seq_dim: int) -> torch.Tensor:
    """Reshape ``(S, h)`` or ``(B, S, h)`` rows to broadcast against an ``ndim``-D tensor whose
    sequence axis is ``seq_dim`` (features last)."""
    if rows.dim() == 2 and seq_dim == ndim - 2:
        return rows                                                      # (S, h) already broadcasts
    shape = [1] * ndim
    shape[seq_dim] = rows.shape[-2]
    shape[-1] = rows.shape[-1]
    if rows.dim() == 3:
        if seq_dim == 0:
            raise ValueError("per-row positions (B, S) need a batch axis before the sequence axis")
        shape[0] = rows.shape[0]
    return rows.reshape(shape)


def check_given_rows(cos_sin: object, *, length: int, batch: int | None, device: torch.device, pairs: int,
                     heads: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows a caller computed once (an encoding's ``cos_sin(positions)``) and passes to every layer:
    ``(cos, sin)`` of shape ``heads + (S, pairs)``, optionally with a leading batch dim of 1 or
    ``batch``; returned without a leading batch dim of 1."""
    if not (isinstance(cos_sin, (tuple, list)) and len(cos_sin) == 2):
        raise TypeError("cos_sin must be the (cos, sin) pair returned by cos_sin(positions)")
    cos, sin = cos_sin
    for name, t in (("cos", cos), ("sin", sin)):
        if not (isinstance(t, torch.Tensor) and t.dtype.is_floating_point):
            raise TypeError(f"cos_sin's {name} must be a floating tensor, got {getattr(t, 'dtype', type(t))}")
        if t.device != device:
            raise ValueError(f"cos_sin's {name} is on {t.device} but q on {device}; move it with .to()")
    shape = tuple(cos.shape)
    lead = shape[: len(shape) - 2 - len(heads)]
    ok = cos.shape == sin.shape and len(shape) >= 2 and shape[-1] == pairs and len(lead) <= 1 and (
        shape[-2] == length) and tuple(shape[len(lead) : len(lead) + len(heads)]) == heads and (
        len(lead) == 0 or (batch is not None and lead[0] in (1, batch)))
    if not ok:
        want = "(H, S, dim/2)" if heads else "(S, dim/2)"
        raise ValueError(
            f"cos_sin must be {want} or with a leading batch dim, from cos_sin(positions), for S={length}, "
            f"dim/2={pairs}; got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if len(lead) and lead[0] == 1:
        cos, sin = cos[0], sin[0]
    return cos, sin
