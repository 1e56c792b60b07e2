"""Hugging Face transformers models with posenc's positional encodings, patched in place.

``patch_model(model)`` makes a loaded model take its positional encoding from posenc, for
``model(...)`` and ``model.generate(...)``, prefill and cached decoding alike; ``unpatch_model`` (or
the ``patched(model)`` context manager) restores the original.  Nothing is decided from a list of
model types: ``patch_model`` looks for the modules that hold a position rule, builds posenc's
version of each, and checks it against the module's own output before it changes anything.

- **RoPE**, any module following transformers' rotary contract (``forward(x, position_ids[,
  layer_type])`` returning ``(cos, sin)``, or Llama 4's complex ``freqs_cis``, with a ``config``):
  posenc builds :meth:`posenc.RotaryEmbedding.from_hf_config` from the module's configuration (one
  table per layer type), finds the format the module returns (``[cos, cos]``, each value twice,
  half width, ``(sin, cos)``, complex) by comparing with the module's output, and from then on the
  module returns posenc's exact values in that format.  The model's attention code still rotates q
  and k; its cache still holds keys rotated once, at the step that produced them, so
  length-dependent rules (dynamic NTK, LongRoPE) follow the model within a generation (the length
  is the largest position + 1 of each step; transformers' dynamic NTK also remembers the longest
  length seen by earlier calls, posenc does not: a module that already grew is checked against a
  fresh copy of itself, and computes as it did when loaded);
- **multimodal RoPE** (Qwen2-VL and its successors): the text model's rotary module returns
  posenc's exact M-RoPE cos/sin (:class:`posenc.MultimodalRotaryEmbedding`) for the ``(3, B, S)``
  positions the model computes (``get_rope_index`` and its rope deltas are the model's own);
- **ALiBi** (BLOOM, MPT): the bias comes from :func:`posenc.alibi_bias` with posenc's slopes;
- **T5 family** (T5, mT5, UMT5, Switch, UDOP, Pop2Piano, Pix2Struct, LongT5's full attention), and
  MPNet's ``compute_position_bias`` (the same buckets): the bucketed relative bias comes from
  :func:`posenc.relative_position_bucket` and the model's own bias weights (so training still updates
  them).

The self-check: before anything is changed, posenc's output is compared with the module's original
output (on a copy, so state such as dynamic NTK's cache is untouched) at positions near 0, around
the original and the extended context, and past it, in float32.  Near 0 they must agree to a few
float32 ulps; further out the allowance grows with the angle, because transformers computes
``position * inv_freq`` in float32 (posenc computes it exactly): ``8 + 16 * |angle|`` ulps of the
value's scale.  ALiBi slopes must agree to 4 ulps, T5 buckets exactly.  Any disagreement refuses the
whole model with a ``ValueError`` naming the module, the positions and the difference, and the model
is left as it was.

The rotation of q and k goes through posenc's engine too (``engine="auto"``, the default), where
the model's ``apply_rotary_pos_emb`` is recognised and reproduced at patch time; the pair layout is
the one the model's own rotate function mixes (:func:`rotation_layout`).  On CPU, and on any device
with ``engine="torch"``, a call of the patched rotary module gathers, with one lookup, its cos/sin
and the 2 x 2 mixing factors of each feature pair of posenc's ``rounding="model"`` engine
(:mod:`posenc.kernels.torch_mix`, what ``apply_rope_qk(..., rounding="model")`` runs); each layer then
rotates q and k with two torch calls apiece, with the same products and additions as the model's
own code, so the outputs are equal bit for bit, in fewer calls.  With Triton on CUDA, ``"auto"``
picks posenc's Triton kernel.

Patch state lives on each patched module (a registered ``posenc_rope`` submodule for tables, picklable
callables for the replaced methods), so ``copy.deepcopy``, ``pickle`` / ``torch.save`` and patching
nested modules keep working; ``state_dict`` never contains posenc's tables, so ``save_pretrained``
writes the model's own weights and ``from_pretrained`` gives an unpatched model.

transformers is never imported by ``import posenc``; this package needs it only to be installed
for the models you pass (it reads their classes and configs, it does not import them itself).

The package, one idea per module: ``_patch`` (the public functions, the walk over a model, the one
INFO record), ``_rotary`` (the generic RoPE adapter), ``_selfcheck`` (probes and the allowance),
``_layout`` (the pair layout of a model's rotate function), ``_stand_in`` (the stand-in for that
function, with its contract), ``_mrope`` (multimodal RoPE), ``_vision`` (vision towers' rotary rules),
``_recomposed`` (modules that lay per-axis angles out with their own layout step, vision or text), ``_bias``
(ALiBi, T5 and MPNet biases), ``_state`` (patch records, apply and undo) and ``_common``.
"""

from __future__ import annotations

import warnings
from typing import Any

from posenc.integrations.transformers._bias import _bloom_alibi, _bloom_forward, _mpnet_bias, _mpt_alibi, _t5_bias
from posenc.integrations.transformers._common import _LEGACY_TYPES
from posenc.integrations.transformers._layout import rotation_layout
from posenc.integrations.transformers._mrope import _HFMropeTables, _MropeAdapter
from posenc.integrations.transformers._patch import is_patched, patch_model, patched, unpatch_model
from posenc.integrations.transformers._rotary import _rotary_forward, _RotaryAdapter, _RotaryTables
from posenc.integrations.transformers._stand_in import _FastEntry, _FastRotate, _FastRotateOne, _KernelEntry
from posenc.integrations.transformers._state import _Call, _Patch
from posenc.integrations.transformers._vision import _AxialAdapter

__all__ = ["is_patched", "patch_model", "patched", "rotation_layout", "unpatch_model"]

#: The names by which models patched (and pickled) by earlier versions of posenc refer to the patch's
#: parts, which lived in one module then.
_PICKLED = (_Patch, _Call, _RotaryTables, _RotaryAdapter, _HFMropeTables, _MropeAdapter, _AxialAdapter, _FastRotate,
            _FastRotateOne, _FastEntry, _KernelEntry, _rotary_forward, _bloom_forward, _bloom_alibi, _mpt_alibi,
            _t5_bias, _mpnet_bias)


def __getattr__(name: str) -> Any:
    if name == "SUPPORTED_MODEL_TYPES":
        warnings.warn("SUPPORTED_MODEL_TYPES is deprecated: patch_model checks each model against its own "
                      "output instead of a list of model types (see docs/integrations.md for the models "
                      "verified with your transformers)", DeprecationWarning, stacklevel=2)
        return _LEGACY_TYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
