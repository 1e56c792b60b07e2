"""Pure torch functions: no modules, no global state."""

from posenc.functional.positions import positions_from_mask
from posenc.functional.rope import (
    apply_rope,
    apply_rope_qk,
    convert_rope_weight,
    layout_permutation,
    rope_cos_sin,
    rope_inv_freq,
)
from posenc.functional.sinusoidal import sinusoidal_encoding, sinusoidal_table

__all__ = [
    "apply_rope",
    "apply_rope_qk",
    "convert_rope_weight",
    "layout_permutation",
    "positions_from_mask",
    "rope_cos_sin",
    "rope_inv_freq",
    "sinusoidal_encoding",
    "sinusoidal_table",
]
