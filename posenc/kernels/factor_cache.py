"""A decode step's factors: views of a packed table, and a cache for ``(cos, sin)`` tables that a
caller passes again and again (not public).

``apply_rope_qk(q, k, cos, sin, offset=)`` in a decode loop receives the same two tables at every
step.  The half layout multiplies by ``[cos | cos]`` and ``[-sin | sin]`` rows and the interleaved
one by ``cos + i sin``: building those rows costs three or four torch calls per step, more than the
rotation's own arithmetic.  This cache builds them once per table pair, as whole tables
(:func:`table_factors`), so that a step looks its rows up like
``RotaryEmbedding`` does.

An entry serves only the tables it was built from, unchanged: the same objects or views with the
same memory, shape and strides (the entry holds the tables, so their memory cannot be reused by
others meanwhile), the same version counters (any in-place write to a table or to a view of it
bumps them) and the same device.  Tables that require grad (the factors would cut their graph),
inference tensors (no version counter) and tables over :data:`MAX_ELEMENTS` (the copy would cost
memory a caller did not ask for) are never cached: their rows are built per call, with the same
values.
"""

from __future__ import annotations

import torch

from posenc.kernels.torch_rope import pack_tables

#: Tables up to this many elements each (e.g. 8192 positions x 64 frequencies) are cached.
MAX_ELEMENTS = 1 << 19
#: Table pairs kept, the most recently used first.
SIZE = 4

_entries: list[tuple] = []


def decode_factors(packed: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """What a decode step multiplies by, as views of a packed table
    (:func:`posenc.kernels.torch_rope.pack_tables`, as ``RotaryEmbedding`` keeps it): ``([cos | cos], [-sin | sin])``, both
    ``(P, 2h)``, for the half layout; ``cos + i sin`` ``(P, h)`` complex for the interleaved one."""
    if layout == "half":
        d = packed.shape[-1] // 2
        return packed[:, :d], packed[:, d:]
    return (torch.view_as_complex(packed.view(packed.shape[0], -1, 2)),)


def table_factors(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """The decode step's factors of float32 ``(P, h)`` tables (or of some of their rows), made new:
    :func:`decode_factors` of their packed form."""
    return decode_factors(pack_tables(cos, sin, layout), layout)


def cached_factors(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...] | None:
    """The factors of float32 ``(P, h)`` tables for :func:`posenc.kernels.torch_decode.decode_qk`, or
    None when these tables are not cached (the caller then builds the rows it needs)."""
    for i, entry in enumerate(_entries):
        e_cos, e_sin = entry[0], entry[1]
        if entry[2] != layout or not (e_cos is cos and e_sin is sin or (  # the very tensors, or new views of
                entry[3] == cos.data_ptr() and entry[4] == sin.data_ptr() and cos.shape == e_cos.shape  # their memory
                and cos.stride() == e_cos.stride() and sin.stride() == e_sin.stride() and cos.device == e_cos.device)):
            continue                                          # other tables (perhaps over the same memory)
        if (entry[3] == cos.data_ptr() and entry[4] == sin.data_ptr() and entry[5] == cos._version
                and entry[6] == sin._version and not (cos.requires_grad or sin.requires_grad)):
            if i:
                _entries.insert(0, _entries.pop(i))
            return entry[7]
        del _entries[i]                                       # these tables changed since: build it again
        break
    if (cos.requires_grad or sin.requires_grad or cos.is_inference() or sin.is_inference()
            or cos.numel() > MAX_ELEMENTS):
        return None
    with torch.no_grad():
        factors = table_factors(cos, sin, layout)
    _entries.insert(0, (cos, sin, layout, cos.data_ptr(), sin.data_ptr(), cos._version, sin._version, factors))
    del _entries[SIZE:]
    return factors


def clear() -> None:
    """Forget every entry (tests; releasing the tables' copies)."""
    _entries.clear()
