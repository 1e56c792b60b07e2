"""Pure torch functions: no modules, no global state."""

from posenc.functional.alibi import alibi_bias, alibi_slopes
from posenc.functional.axial import apply_axial_rope, axial_cos_sin, grid_positions
from posenc.functional.cache import rope_and_cache
from posenc.functional.mrope import mrope_cos_sin, mrope_positions
from posenc.functional.norm_rope import rms_norm_rope_qk
from posenc.functional.positions import positions_from_cu_seqlens, positions_from_mask, positions_from_segment_ids
from posenc.functional.relative import clipped_relative_position, relative_distances, relative_position_bucket
from posenc.functional.resize import resize_position_embedding
from posenc.functional.rope import (
    apply_rope,
    apply_rope_qk,
    convert_rope_weight,
    layout_permutation,
    rope_cos_sin,
    rope_inv_freq,
)
from posenc.functional.sincos_nd import sincos_table_nd
from posenc.functional.sinusoidal import sinusoidal_encoding, sinusoidal_table
from posenc.functional.window import attention_temperature, attention_window_mask

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_axial_rope",
    "apply_rope",
    "apply_rope_qk",
    "attention_temperature",
    "attention_window_mask",
    "axial_cos_sin",
    "clipped_relative_position",
    "convert_rope_weight",
    "grid_positions",
    "layout_permutation",
    "mrope_cos_sin",
    "mrope_positions",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "positions_from_segment_ids",
    "relative_distances",
    "relative_position_bucket",
    "resize_position_embedding",
    "rms_norm_rope_qk",
    "rope_and_cache",
    "rope_cos_sin",
    "rope_inv_freq",
    "sincos_table_nd",
    "sinusoidal_encoding",
    "sinusoidal_table",
]
