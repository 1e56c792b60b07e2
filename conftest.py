# Keras reads KERAS_BACKEND at import; default to the torch backend unless a run picks another.
import os

os.environ.setdefault("KERAS_BACKEND", "torch")
