"""QK-RMSNorm followed by RoPE, for queries and keys together: pure torch functions.

Qwen3 and Gemma-3 normalise each head of q and k with an RMSNorm (Zhang and Sennrich 2019, "Root
Mean Square Layer Normalization", arXiv:1910.07467) whose weight of size ``D`` is shared by all
heads, right before the rotary embedding; OLMo-2 normalises the whole q (and k) projection of a
token (weight of size ``H*D``) before splitting it into heads and rotating them.  Gemma's RMSNorm
scales by ``1 + weight``.  One call does both steps::

    y = rotate(x * rsqrt(mean(x^2) + eps) * (weight_offset + weight))

in float32 (float64 for float64 inputs), rounded once to the input dtype.  The rotation is
:func:`posenc.functional.rope.apply_rope_qk`'s, with the same tables, positions and layouts.
"""

from __future__ import annotations

import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch import plans
from posenc._torch.checks import check_float_tensor, check_position_args, check_qk, check_same_device
from posenc._torch.engine_choice import engine_from_backend
from posenc._torch.rope_call import (
    check_table_options,
    choose_engine,
    promise,
    table_positions_ok,
    table_rotary_dim,
)
from posenc.kernels import engine as _engine

__all__ = ["rms_norm_rope_qk"]


def rms_norm_rope_qk(
    q: torch.Tensor,
    k: torch.Tensor | None,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    positions: torch.Tensor | None = None,
    offset: int = 0,
    layout: str = "half",
    seq_dim: int = -2,
    engine: str = "auto",
    backend: str = UNSET,
    assume_valid: bool = False,
    assume_in_table: bool = UNSET,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMS-normalise queries and keys, scale them by their norm weights and rotate them (QK-norm + RoPE).

    Each head ``x`` of q (and of k) becomes::

        y = rotate(x * rsqrt(mean(x^2) + eps) * (weight_offset + weight))

    computed in float32 (float64 for float64 inputs) and rounded once to the input dtype.  The shape
    of the weight decides what the mean runs over:

    - ``(D,)``: each head on its own, one weight shared by all heads (Qwen3, Gemma-3);
    - ``(H*D,)``: all heads of a token together, as OLMo-2 normalises the whole q (or k) projection
      before splitting heads; ``weight[h*D:(h+1)*D]`` then scales head ``h``.

    Gemma's RMSNorm scales by ``1 + weight``: pass ``weight_offset=1.0``.  The rotation is that of
    :func:`posenc.functional.rope.apply_rope_qk`: rows of ``(P, d/2)`` tables for ``positions`` or
    ``offset + arange(S)``, both layouts, a rotary dim ``d <= D`` (features past ``d`` are
    normalised and scaled, not rotated) and GQA (k with its own head count).

    Hugging Face's ``Qwen3RMSNorm`` (and OLMo-2's) rounds to the input dtype between the norm and
    the weight, and again before the rotation, which rounds each product it computes.  posenc rounds
    once, so in bfloat16 or float16 it is closer to the exact result and can differ from Hugging
    Face by an ulp or so; in float32 the two agree to float32 rounding.

    Args:
        q: ``(B, H, S, D)`` (``seq_dim=-2``) or ``(B, S, H, D)`` (``seq_dim=1``); any strides, e.g.
            views of a fused qkv projection.
        k: like ``q`` with its own head count, or None.
        q_weight: q's RMSNorm weight, ``(D,)`` or ``(H*D,)``, any floating dtype, on q's device.
        k_weight: k's RMSNorm weight, ``(D,)`` or ``(H_k*D,)``; None exactly when ``k`` is None.
        cos, sin: tables ``(P, d/2)``, e.g. ``rope_cos_sin(torch.arange(P), inv_freq)``.
        eps: added to the mean square (``rms_norm_eps`` in Hugging Face configs); > 0.
        weight_offset: added to the weights: 0 (Qwen3, OLMo-2) or 1 (Gemma).
        positions: integer positions, ``(S,)`` or ``(B, S)``; default ``offset + arange(S)``.
        offset: first position when ``positions`` is None (step-by-step decoding).
        layout: ``"half"`` (pairs ``i, i + d/2``) or ``"interleaved"`` (pairs ``2i, 2i + 1``).
        seq_dim: the sequence axis of q and k: ``-2``/``2`` or ``1``.
        engine: ``"auto"`` (the fused Triton kernel for supported CUDA tensors, else torch),
            ``"torch"`` or ``"triton"`` (one launch for q and k forward and one backward; raises if
            it cannot take the case).
        backend: the old name of ``engine`` (deprecated; it still works for now).
        assume_valid: promise that every entry of ``positions`` lies in ``[0, P)``, so that their
            range is not read back from the device (no synchronisation, as a CUDA graph needs).
            (Formerly ``assume_in_table``, which still works for now with a ``DeprecationWarning``.)

    Shape:
        - q: ``(B, H, S, D)`` or ``(B, S, H, D)``; k: the same with ``H_k`` heads.
        - cos, sin: ``(P, d/2)`` with ``d <= D``.
        - outputs: the shapes and dtypes of q and k.

    Returns:
        ``(q_out, k_out)``: new tensors (``k_out`` is None when ``k`` is None), differentiable with
        respect to q, k, q_weight and k_weight on both engines.

    Raises:
        TypeError: non-tensor or non-floating q/k/weights/cos/sin, non-integer positions, a
            non-number ``eps``.
        ValueError: q and k not 4-D with the sequence on axis 1 or 2, a weight of another shape
            than ``(D,)`` or ``(H*D,)`` or on another device, ``k_weight`` without ``k`` (or the
            reverse), ``eps <= 0``, positions outside the tables, an unknown layout or engine,
            ``engine="triton"`` for a case the kernel cannot take.

    Examples:
        >>> from posenc.functional import rope_cos_sin
        >>> cos, sin = rope_cos_sin(torch.arange(4), torch.tensor([1.0], dtype=torch.float64))
        >>> q = torch.tensor([3.0, 4.0]).reshape(1, 1, 1, 2)      # one head: rms = sqrt(12.5)
        >>> w = torch.ones(2)
        >>> q_out, _ = rms_norm_rope_qk(q, None, w, None, cos, sin)  # position 0: no rotation
        >>> q_out.flatten()
        tensor([0.8485, 1.1314])
        >>> q_out, _ = rms_norm_rope_qk(q, None, w, None, cos, sin, offset=1)   # rotated by 1 radian
        >>> q_out.flatten()
        tensor([-0.4936,  1.3253])

    References:
        Zhang and Sennrich 2019, "Root Mean Square Layer Normalization" (arXiv:1910.07467); Su et
        al. 2021, "RoFormer" (arXiv:2104.09864); Qwen3, Gemma 3 and OLMo 2 technical reports.
    """
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("rms_norm_rope_qk", backend, engine)
    key = None
    T = torch.Tensor
    if (assume_in_table is UNSET and type(q) is T and (k is None or type(k) is T) and type(q_weight) is T
            and (k_weight is None or type(k_weight) is T) and type(cos) is T and type(sin) is T
            and (positions is None or type(positions) is T) and type(offset) is int and type(seq_dim) is int
            and (assume_valid is False or assume_valid is True) and type(eps) is float
            and type(weight_offset) is float and not torch.compiler.is_compiling()):
        # step 0: a call with the signature of one validated before runs its plan (posenc._torch.plans)
        try:
            key = ("rms_norm_rope_qk", q.shape, q.stride(), q.dtype, q.device, q.requires_grad,
                   None if k is None else (k.shape, k.stride(), k.dtype, k.device, k.requires_grad),
                   q_weight.shape, q_weight.stride(), q_weight.dtype, q_weight.device, q_weight.requires_grad,
                   None if k_weight is None else (k_weight.shape, k_weight.stride(), k_weight.dtype, k_weight.device,
                                                  k_weight.requires_grad),
                   cos.shape, cos.stride(), cos.dtype, cos.device, cos.requires_grad,
                   sin.shape, sin.stride(), sin.dtype, sin.device, sin.requires_grad,
                   None if positions is None else (positions.shape, positions.stride(), positions.dtype,
                                                   positions.device),
                   eps, weight_offset, layout, seq_dim, engine, assume_valid, torch.is_grad_enabled())
        except RuntimeError:                                            # (sparse tensors have no strides)
            key = None
        plan = plans.find(key, q, k, positions, offset, False)
        if plan is not None:
            return plan.run(q, k, q_weight, k_weight, cos, sin, positions, offset)
    if assume_in_table is not UNSET:
        assume_valid = promise("rms_norm_rope_qk", assume_in_table, assume_valid)
    sd = check_qk(q, k, seq_dim, table_rotary_dim(cos, sin))
    if q.dim() != 4 or sd not in (1, 2):
        raise ValueError(
            f"q must be 4-D, (B, H, S, D) with seq_dim=-2 or (B, S, H, D) with seq_dim=1, to know its heads; got "
            f"shape {tuple(q.shape)} with seq_dim={seq_dim}"
        )
    check_table_options(q, cos, sin, layout, engine)
    if type(assume_valid) is not bool:
        _validate.check_bool("assume_valid", assume_valid)
    eps = _validate.check_float("eps", eps, positive=True)
    weight_offset = _validate.check_float("weight_offset", weight_offset)
    head_axis = 3 - sd                                                  # (B, H, S, D): 1; (B, S, H, D): 2
    _check_norm_weight("q_weight", q_weight, q, head_axis)
    if k is None:
        if k_weight is not None:
            raise ValueError("k_weight is given but k is None; pass k (keys to normalise) or k_weight=None")
        pass
    elif k_weight is None:
        raise ValueError("k is given but k_weight is None; pass k's RMSNorm weight, (D,) or (H_k*D,)")
    else:
        _check_norm_weight("k_weight", k_weight, k, head_axis)
    seq_len = q.shape[sd]
    positions, offset = check_position_args(positions, offset, seq_len, q.shape[0], q.device)
    positions = table_positions_ok(positions, offset, seq_len, cos.shape[0], assume_valid)
    why = None
    if cos.requires_grad or sin.requires_grad:
        why = "gradients with respect to cos/sin are computed by the torch engine"
    name = choose_engine(engine, q, k, sd, why)
    mod = _engine("rms_norm_rope_qk", name)
    if torch.compiler.is_compiling():
        return mod.rms_norm_rope_qk(q, k, q_weight, k_weight, cos=cos, sin=sin, positions=positions, offset=offset,
                                    eps=eps, weight_offset=weight_offset, layout=layout, seq_dim=sd)
    rotation = mod.prepare(q, k, q_weight, k_weight, cos, sin, positions, offset, eps, weight_offset, layout, sd)
    read_range = positions is not None and not assume_valid and seq_len > 0
    plans.put(key, plans.Plan(rotation, cos.shape[0], seq_len, read_range))
    return rotation(q, k, q_weight, k_weight, cos, sin, positions, offset)


def _check_norm_weight(name: str, weight: object, x: torch.Tensor, head_axis: int) -> None:
    """Check an RMSNorm weight of ``x``: ``(D,)`` (each head) or ``(H*D,)`` (all heads of a token together)."""
    weight = check_float_tensor(name, weight)
    if weight.device != x.device:
        check_same_device(name, weight, "q", x.device)
    heads, dim = x.shape[head_axis], x.shape[-1]
    if weight.dim() == 1 and weight.shape[0] in (dim, heads * dim):
        return
    raise ValueError(
        f"{name} must have shape ({dim},) to normalise each head (Qwen3, Gemma-3) or ({heads * dim},) = (H*D,) to "
        f"normalise all {heads} heads of a token together (OLMo-2); got {tuple(weight.shape)}"
    )
