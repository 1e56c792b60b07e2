"""The first import of :mod:`posenc.keras`: Keras and its backend, or one clear error."""

from __future__ import annotations

import os


def _import_keras() -> None:
    """Import Keras once, here, so that a missing package or backend is one clear error instead of a failure
    deep inside Keras."""
    backend = os.environ.get("KERAS_BACKEND")
    try:
        import keras  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name == "keras" or (e.name or "").startswith("keras."):
            raise ImportError(
                "posenc.keras needs Keras 3 and one of its backends: in a clone of posenc, pip install '.[keras-jax]' "
                "(Keras and JAX) and set KERAS_BACKEND=jax before importing") from e
        raise ImportError(
            f"posenc.keras: Keras could not load its backend {backend or 'tensorflow (Keras default)'!r}: the package "
            f"{e.name!r} is not installed; install a backend (pip install jax, torch or tensorflow) and set "
            f"KERAS_BACKEND to it (jax, torch or tensorflow) before the first import of keras") from e


_import_keras()
