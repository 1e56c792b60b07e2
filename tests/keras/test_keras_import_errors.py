"""``import posenc.keras`` without Keras, or without the backend ``KERAS_BACKEND`` names, is one clear
``ImportError`` saying what to install and set (run in fresh interpreters: Keras reads its backend once)."""

import os
import subprocess
import sys

import pytest
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _import(env_backend, prelude=""):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    if env_backend is not None:
        env["KERAS_BACKEND"] = env_backend
    code = prelude + "import posenc.keras"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_backend_that_is_not_installed_is_named_with_the_fix():
    try:
        import tensorflow  # noqa: F401
        pytest.skip("TensorFlow is installed here: its backend loads")
    except ImportError:
        pass
    run = _import("tensorflow")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: posenc.keras: Keras could not load its backend 'tensorflow'")
    assert "'tensorflow' is not installed" in last and "KERAS_BACKEND" in last


def test_missing_keras_names_the_install_line():
    run = _import("jax", prelude="import sys; sys.modules['keras'] = None; ")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: posenc.keras needs Keras 3") and "pip install '.[keras-jax]'" in last


def test_the_keras_jax_extra_brings_a_backend_and_imports():
    pytest.importorskip("jax", reason="JAX is not installed")
    pytest.importorskip("keras", reason="Keras is not installed")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert any(r.startswith("jax") for r in extras["keras-jax"]) and any(r.startswith("keras") for r in extras["keras-jax"])
    run = _import("jax", prelude="")
    assert run.returncode == 0, run.stderr
