# Keras reads KERAS_BACKEND at import; default to the torch backend unless a run picks another.
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

# The deprecated alias package warns on import; it has no doctests to collect.
collect_ignore = ["posenc/models"]
