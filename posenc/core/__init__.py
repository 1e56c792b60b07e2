"""Framework-free maths (NumPy float64, :mod:`math` and :mod:`decimal`): the single source of truth
that the torch and Keras sides both build on.  Nothing here imports torch or keras."""

from posenc.core import alibi, exact, hf_config, relative, rope, sinusoidal

__all__ = ["alibi", "exact", "hf_config", "relative", "rope", "sinusoidal"]
