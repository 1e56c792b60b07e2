"""Shared machinery of the bad-input suites (``tests/test_*_bad_inputs.py``, one per family).

Every case either matches an independent float64 reference from ``tests/reference/`` (valid but unusual
inputs: narrow or unsigned integer positions, empty sequences, non-contiguous or expanded tensors, negative
positions, NaN flowing through), or raises ``ValueError``/``TypeError`` whose message names the offending
argument.  Any other exception (``IndexError``, ``RuntimeError``, ``ZeroDivisionError``,
``NotImplementedError``, an ``AssertionError`` inside posenc, ...) and any warning raised by a call fail
the case: see :func:`guarded`.

Each family file fills a :class:`Cases` table named ``CASES`` and runs it with :func:`run_case`;
``tests/test_bad_inputs.py`` walks every public name against the union of those tables.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch

from tests.reference.rope_oracle import cos_sin, default, rotate_np

NAN, INF = float("nan"), float("inf")
META = "meta"
BASE = 10000.0
EXACT = r"must lie within \[-2\*\*31, 2\*\*31\]"


# ---- the generic guard ----------------------------------------------------------------------------


def guarded(thunk: Callable[[], object]) -> object:
    """Run ``thunk``; only ``ValueError``/``TypeError`` may escape, and no warning may be raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return thunk()
    except (ValueError, TypeError):
        raise
    except Exception as err:  # noqa: BLE001 - every other exception is the failure this suite looks for
        pytest.fail(f"{type(err).__name__} escaped (only ValueError/TypeError may): {err}", pytrace=False)


class Cases:
    """One family's case table: ``params`` holds ``pytest.param(name, thunk, error, check)``."""

    def __init__(self) -> None:
        self.params: list = []

    def bad(self, name: str, case_id: str, thunk: Callable[[], object], exc: type[Exception], match: str,
            marks=()) -> None:
        """A case that must raise ``exc`` with a message matching ``match`` (which names the argument);
        ``marks`` (e.g. a strict ``xfail`` naming a known package bug) go on the param."""
        self.params.append(pytest.param(name, thunk, (exc, match), None, id=f"{name}-{case_id}", marks=marks))

    def good(self, name: str, case_id: str, thunk: Callable[[], object], check: Callable[[object], None]) -> None:
        """A valid unusual input: ``check`` compares the result with a float64 reference."""
        self.params.append(pytest.param(name, thunk, None, check, id=f"{name}-{case_id}"))


def run_case(thunk: Callable[[], object], error, check) -> None:
    """Run one case: a valid input's result passes ``check``; a bad one raises ``error = (exc, match)``."""
    if error is None:
        check(guarded(thunk))
        return
    exc, match = error
    with pytest.raises(exc, match=match):
        guarded(thunk)


# ---- comparisons and inputs -------------------------------------------------------------------------


def arr(t) -> np.ndarray:
    return t.detach().double().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def close(got, want, atol: float = 1e-6, rtol: float = 1e-6) -> None:
    """``got`` (tensor or tuple of tensors) equals ``want`` (arrays), NaN where the reference has NaN."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            close(g, w, atol, rtol)
        return
    assert isinstance(got, torch.Tensor), type(got)
    want = np.asarray(want)
    assert tuple(got.shape) == want.shape, (tuple(got.shape), want.shape)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    else:
        np.testing.assert_allclose(arr(got), want, atol=atol, rtol=rtol, equal_nan=True)


def is_meta(shape):
    """A check that the result is meta tensors of ``shape`` (one shape, or a tuple of shapes)."""
    return lambda out: (all(t.is_meta and tuple(t.shape) == s for t, s in zip(
        out if isinstance(out, tuple) else (out,), shape if isinstance(shape[0], tuple) else (shape,), strict=True))
        or pytest.fail(f"not meta tensors of shape {shape}"))


def rand(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Deterministic N(0, 1) tensor (its own generator: a reference can rebuild it)."""
    g = torch.Generator().manual_seed(seed * 1009 + sum(shape) * 31 + len(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def ref_cos_sin(p, d: int, base: float = BASE) -> tuple[np.ndarray, np.ndarray]:
    """The reference cos/sin of rotary dim ``d`` (``tests.reference.rope_oracle``)."""
    return cos_sin(p, default(d, base))


def ref_rope(x, p, *, d: int | None = None, layout: str = "half", base: float = BASE, theta=None) -> np.ndarray:
    """The reference rotation (``tests.reference.rope_oracle``) of the first ``d`` features (default: all)."""
    d = x.shape[-1] if d is None else d
    return rotate_np(x, p, default(d, base) if theta is None else theta, layout)


def np_tables(rows: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(rows, d/2)`` cos/sin tables from the formula (independent of posenc)."""
    c, s = ref_cos_sin(np.arange(rows), d)
    return torch.tensor(c, dtype=torch.float32), torch.tensor(s, dtype=torch.float32)


C8, S8 = np_tables(8, 8)                                                   # 8 rows, rotary dim 8
P3 = torch.tensor([0, 5, 2])
SLOPES = torch.tensor([0.5, 0.25])


def rope_good(cases: Cases, name, case_id, make_x, run, want, atol=1e-5, inplace=False):
    """``run(x)`` must equal ``want(x0)`` (``x0``: ``x`` before the call); in place, it returns ``x``."""
    def thunk():
        x = make_x()
        x0 = x.detach().clone()
        return run(x), x, x0

    def check(r):
        out, x, x0 = r
        first = out[0] if isinstance(out, tuple) else out
        if inplace:
            assert first is x, "in place must return x itself"
        assert first.dtype == x.dtype, "the result keeps x's dtype"
        close(out, want(x0), atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
    cases.good(name, case_id, thunk, check)


def check_rotated(qo, ko, q0, want_q, want_k, atol):
    """A rotated ``(q, k)`` pair against the reference: q keeps its dtype, k is None when none was given."""
    assert qo.dtype == q0.dtype
    close(qo, want_q, atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
    if want_k is None:
        assert ko is None
    else:
        close(ko, want_k, atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
