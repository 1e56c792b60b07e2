"""Pure torch functions: no modules, no global state."""

from posenc.functional.alibi import alibi_bias, alibi_slopes
from posenc.functional.positions import positions_from_mask, positions_from_segment_ids
from posenc.functional.relative import relative_distances, relative_position_bucket
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
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_qk",
    "convert_rope_weight",
    "layout_permutation",
    "positions_from_mask",
    "positions_from_segment_ids",
    "relative_distances",
    "relative_position_bucket",
    "rope_cos_sin",
    "rope_inv_freq",
    "sinusoidal_encoding",
    "sinusoidal_table",
]
