"""Pure torch functions: no modules, no global state."""

from posenc.functional.positions import positions_from_mask
from posenc.functional.sinusoidal import sinusoidal_encoding, sinusoidal_table

__all__ = ["positions_from_mask", "sinusoidal_encoding", "sinusoidal_table"]
