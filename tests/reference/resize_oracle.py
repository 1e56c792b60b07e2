"""Independent recipes for resizing a position-embedding table (Dosovitskiy et al. 2021, section 3.2:
"2D interpolation of the pre-trained position embeddings, according to their location in the original
image"), written without posenc.

``resize_2d`` is the usual recipe (reshape the grid rows to an image, ``torch.nn.functional.interpolate``
with ``align_corners=False``, reshape back, prefix rows kept); ``linear_1d`` is linear resampling of a 1-D
table written from the formula.
"""

from __future__ import annotations

import numpy as np
import torch


def resize_2d(table: torch.Tensor, new, old, prefix: int, mode: str = "bicubic", antialias: bool = True) -> torch.Tensor:
    """``table (N, C)`` or ``(1, N, C)``: ``prefix`` rows kept, the ``old`` grid resized to ``new``."""
    t = table.reshape(-1, table.shape[-1])                                     # (N, C)
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    grid = t[prefix:].to(work).T.reshape(1, -1, *old)                          # (1, C, H, W)
    kw = {"align_corners": False} if mode in ("bicubic", "bilinear") else {}
    out = torch.nn.functional.interpolate(grid, size=new, mode=mode, antialias=antialias, **kw)
    out = out.reshape(t.shape[1], -1).T.to(t.dtype)                            # (H' * W', C)
    return torch.cat([t[:prefix], out]).reshape(*table.shape[:-2], -1, table.shape[-1])


def linear_1d(values: np.ndarray, new: int) -> np.ndarray:
    """Linear resampling (align_corners=False) of ``values (N, C)`` to ``new`` rows, from the formula."""
    n = values.shape[0]
    src = np.clip((np.arange(new) + 0.5) * n / new - 0.5, 0, n - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    frac = (src - lo)[:, None]
    return values[lo] * (1 - frac) + values[hi] * frac
