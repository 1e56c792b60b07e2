"""Framework-free maths (NumPy float64, :mod:`math` and :mod:`decimal`): the single source of truth
that the torch and Keras sides both build on.  Nothing here imports torch or keras."""

from posenc.core import exact, hf_config, rope, sinusoidal

__all__ = ["exact", "hf_config", "rope", "sinusoidal"]
