"""posenc for Keras 3: the same encodings, argument names and numbers on any Keras backend.

Install with ``pip install ".[keras-jax]"`` in a clone of posenc (Keras and JAX; ``.[keras]`` for Keras alone,
where a backend is installed) and pick the backend with ``KERAS_BACKEND`` (``jax``, ``tensorflow`` or
``torch``) before the first import of Keras; without that backend the import raises one ``ImportError``
saying what to install and set.  Importing this package never imports torch itself; the tables come from the
framework-free :mod:`posenc.core` (NumPy float64), as on the torch side.
"""

from posenc.core.rope import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    YarnScaling,
)
from posenc.core.schedule import (
    LayerPositions,
    Llama4Temperature,
    LogNTemperature,
    PositionSchedule,
    RopeSpec,
    SSMaxTemperature,
)
from posenc.keras import _backend  # noqa: F401  (first: a missing Keras or backend is one clear error)
from posenc.keras.axial_rotary import AxialRotaryEmbedding
from posenc.keras.bias import AlibiBias, RelativePositionBias
from posenc.keras.learned import LearnedPositionalEmbedding
from posenc.keras.rotary import RotaryEmbedding
from posenc.keras.sincos_nd import SinusoidalEncodingND
from posenc.keras.sinusoidal import SinusoidalEncoding
from posenc.keras.window import attention_temperature, attention_window_mask, schedule_from_hf

__all__ = [
    "AlibiBias",
    "AxialRotaryEmbedding",
    "DynamicNTKScaling",
    "LayerPositions",
    "LearnedPositionalEmbedding",
    "LinearScaling",
    "Llama3Scaling",
    "Llama4Temperature",
    "LogNTemperature",
    "LongRopeScaling",
    "NTKScaling",
    "PositionSchedule",
    "ProportionalScaling",
    "RelativePositionBias",
    "RopeSpec",
    "RotaryEmbedding",
    "SSMaxTemperature",
    "SinusoidalEncoding",
    "SinusoidalEncodingND",
    "YarnScaling",
    "attention_temperature",
    "attention_window_mask",
    "schedule_from_hf",
]
