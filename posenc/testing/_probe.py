"""Calling a user's rotary code on chosen inputs, whatever its calling convention.

Three conventions are accepted (``call=``):

``"rotate"``
    ``fn(q, k, positions) -> (q, k)``: the whole rotation (posenc's ``RotaryEmbedding`` wrapped in a
    lambda, a model's attention helper, a peer's ``apply_rotary_emb``).
``"cos_sin"``
    ``fn(x, positions) -> (cos, sin)``: a table module, as Hugging Face's ``*RotaryEmbedding``
    (``forward(x, position_ids)``).  The rotation is then the standard one in the layout the table
    implies (``cos`` repeated per half or per adjacent pair); its direction is assumed, not measured.
``"apply"``
    ``fn(q, k, cos, sin) -> (q, k)`` with ``cos, sin = cos_sin(x, positions)``: an
    ``apply_rotary_pos_emb``-style function with its table module.

Everything here works on ``N`` probe vectors at ``S`` positions, ``x`` of shape ``(N, S, D)``; the
user's code sees them as heads: ``(1, N, S, D)`` for ``qk_format="bhsd"`` (Hugging Face, posenc's
modules) or ``(1, S, N, D)`` for ``"bshd"``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from posenc import _validate

CALLS = ("auto", "rotate", "cos_sin", "apply")
QK_FORMATS = ("bhsd", "bshd")


class Probe:
    """A user's rotary code, called on probe vectors; outputs come back as float64 NumPy arrays."""

    def __init__(self, fn: Any, *, head_dim: int, call: str = "auto", cos_sin: Any = None,
                 qk_format: str = "bhsd", device: Any = None) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable (a rotation, a cos/sin module or an apply function), got "
                            f"{type(fn).__name__}")
        self.head_dim = _validate.check_int("head_dim", head_dim, minimum=2)
        call = _validate.check_choice("call", call, CALLS)
        self.qk_format = _validate.check_choice("qk_format", qk_format, QK_FORMATS)
        if cos_sin is not None and not callable(cos_sin):
            raise TypeError(f"cos_sin must be a callable returning (cos, sin) for (x, positions), got "
                            f"{type(cos_sin).__name__}")
        if call == "auto":
            call = "apply" if cos_sin is not None else _guess_call(fn)
        if call == "apply" and cos_sin is None:
            raise ValueError("call='apply' needs cos_sin=: the module that gives the apply function its cos and sin "
                             "(e.g. the model's rotary embedding)")
        if call != "apply" and cos_sin is not None:
            raise ValueError(f"cos_sin= is only used with call='apply', got call={call!r}; drop cos_sin or pass "
                             f"call='apply'")
        self.fn, self.call, self.cos_sin_fn = fn, call, cos_sin
        self.device = check_device(device)
        self._batched: bool | None = None            # positions passed as (1, S) (True) or (S,) (False)
        self.table_layout: str | None = None         # for call="cos_sin": the layout the cos table implies
        self.sin_first: bool | None = None           # for call="cos_sin": the module returns (sin, cos)
        self._at0: int | None = None                 # index of position 0 in the call being made, if any

    # -- packing -----------------------------------------------------------------------------------

    def _pack(self, x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(np.asarray(x), dtype=torch.float64).to(self.device, dtype)     # (N, S, D)
        return t.unsqueeze(0) if self.qk_format == "bhsd" else t.transpose(0, 1).unsqueeze(0)

    def _unpack(self, out: Any, n: int, s: int, what: str) -> np.ndarray:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"fn returned {type(out).__name__} for {what}, expected a tensor")
        shape = (1, n, s, self.head_dim) if self.qk_format == "bhsd" else (1, s, n, self.head_dim)
        if tuple(out.shape) != shape:
            raise ValueError(f"fn returned {what} of shape {tuple(out.shape)}, expected {shape} (the input's shape, "
                             f"qk_format={self.qk_format!r}); if your code takes (B, S, H, D), pass qk_format='bshd'")
        out = out.detach().to("cpu", torch.float64)[0]
        return (out if self.qk_format == "bhsd" else out.transpose(0, 1)).numpy()

    def _positions(self, positions: np.ndarray) -> torch.Tensor:
        p = torch.as_tensor(positions, dtype=torch.int64, device=self.device)
        return p.unsqueeze(0) if self._batched in (None, True) else p

    # -- calling -----------------------------------------------------------------------------------

    def rotate(self, xq: np.ndarray, xk: np.ndarray, positions: np.ndarray,
               dtype: torch.dtype = torch.float32) -> tuple[np.ndarray, np.ndarray]:
        """``(q_rotated, k_rotated)`` of the probe vectors ``xq``, ``xk`` ``(N, S, D)`` at ``positions`` ``(S,)``."""
        n, s = xq.shape[0], xq.shape[1]
        q, k = self._pack(xq, dtype), self._pack(xk, dtype)
        zero = np.nonzero(np.asarray(positions) == 0)[0]
        self._at0 = int(zero[0]) if len(zero) else None
        tries = (True, False) if self._batched is None else (self._batched,)
        error: Exception | None = None
        for batched in tries:
            self._batched = batched
            try:
                with torch.no_grad():
                    out = self._call(q.clone(), k.clone(), self._positions(positions))
                result = self._unpack(out[0], n, s, "q"), self._unpack(out[1], n, s, "k")
            except Exception as e:                  # noqa: BLE001 -- the other position shape, else re-raised
                error = error or e
                continue
            return result
        self._batched = None
        assert error is not None                   # the loop ran at least once
        if not isinstance(error, (TypeError, ValueError)):
            # the user's code failed on its own: its error as it is, with what it was given
            note = getattr(error, "add_note", None)      # Python 3.11+
            if note is not None:
                note(f"posenc.testing called fn (call={self.call!r}) with q and k of shape {tuple(q.shape)} "
                     f"(qk_format={self.qk_format!r}, head_dim={self.head_dim}): check head_dim and qk_format")
            raise error
        raise type(error)(f"calling fn as call={self.call!r} failed on probe inputs (positions tried as (1, S) and "
                          f"(S,)): {error}") from error

    def _call(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[Any, Any]:
        if self.call == "rotate":
            out = self.fn(q, k, positions)
        else:
            table_fn = self.cos_sin_fn if self.call == "apply" else self.fn
            cos, sin = _two(table_fn(q, positions), "cos_sin" if self.call == "apply" else "fn", "(cos, sin)")
            out = self.fn(q, k, cos, sin) if self.call == "apply" else self._standard(q, k, cos, sin)
        return _two(out, "fn", "(q, k)")

    def _standard(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[Any, Any]:
        """The standard rotation with a module's cos/sin, in the layout the cos table implies."""
        cos, sin = cos.to(torch.float64), sin.to(torch.float64)
        s = q.shape[2] if self.qk_format == "bhsd" else q.shape[1]
        cos, sin = cos.reshape(-1, s, cos.shape[-1])[0], sin.reshape(-1, s, sin.shape[-1])[0]     # (S, Dc)
        if self.sin_first is None:                # (cos, sin) or, as GPT-J's module returns them, (sin, cos)
            at0 = self._at0
            self.sin_first = at0 is not None and bool((cos[at0] == 0).all() and (sin[at0] != 0).any())
        if self.sin_first:
            cos, sin = sin, cos
        width = cos.shape[-1]
        if self.table_layout is None:
            half = width % 2 == 0 and bool((cos[:, : width // 2] == cos[:, width // 2:]).all())
            pairs = width % 2 == 0 and bool((cos[:, 0::2] == cos[:, 1::2]).all())
            self.table_layout = "half" if half else "interleaved" if pairs else "per-pair"
        if self.table_layout == "per-pair":               # one value per pair: expand as the half layout
            cos, sin, width = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), 2 * width
            layout = "half"
        else:
            layout = self.table_layout
        if width > self.head_dim:
            raise ValueError(f"fn returned cos/sin {width} features wide for head_dim={self.head_dim}")
        shape = (s, 1, width) if self.qk_format == "bshd" else (1, s, width)

        def rot(x: torch.Tensor) -> torch.Tensor:
            x64 = x.to(torch.float64)
            part = x64[..., :width]
            if layout == "half":
                other = torch.cat((-part[..., width // 2:], part[..., : width // 2]), -1)
            else:
                other = torch.stack((-part[..., 1::2], part[..., 0::2]), -1).flatten(-2)
            out = part * cos.reshape(shape) + other * sin.reshape(shape)
            return torch.cat((out, x64[..., width:]), -1).to(x.dtype)

        return rot(q), rot(k)


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` that can hold tensors here (CPU by default), else ``ValueError``."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, TypeError) as e:
        raise ValueError(f"device={device!r} cannot hold tensors here ({e}); pass 'cpu' or an available GPU") from e
    if dev.type == "meta":
        raise ValueError("device='meta' holds no values to read back; pass 'cpu' or a GPU")
    return dev


def _two(out: Any, who: str, what: str) -> tuple[Any, Any]:
    if not isinstance(out, (tuple, list)) or len(out) < 2:
        raise TypeError(f"{who} must return {what}, got {type(out).__name__}")
    return out[0], out[1]


def _guess_call(fn: Callable[..., Any]) -> str:
    """``"rotate"`` for three required positional parameters, ``"cos_sin"`` for two."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = [p for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):                   # a builtin without a signature
        return "rotate"
    if len(params) == 2:
        return "cos_sin"
    if len(params) == 3:
        return "rotate"
    raise TypeError(
        f"could not tell how to call fn from its signature ({len(params)} required positional parameters): pass "
        f"call='rotate' for fn(q, k, positions) -> (q, k), call='cos_sin' for fn(x, positions) -> (cos, sin), or "
        f"call='apply' with cos_sin= for fn(q, k, cos, sin) -> (q, k)"
    )
