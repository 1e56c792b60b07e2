"""Framework-free maths (NumPy float64, :mod:`math` and :mod:`decimal`): the single source of truth
that the torch and Keras sides both build on.  Nothing here imports torch or keras."""

from posenc.core import alibi, axial, exact, hf_config, mrope, relative, rope, sincos_nd, sinusoidal

__all__ = ["alibi", "axial", "exact", "hf_config", "mrope", "relative", "rope", "sincos_nd", "sinusoidal"]
