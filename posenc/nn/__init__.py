"""Thin ``torch.nn`` modules over :mod:`posenc.functional`."""

from posenc.nn.learned import LearnedPositionalEmbedding
from posenc.nn.rotary import RotaryEmbedding
from posenc.nn.sinusoidal import SinusoidalEncoding

__all__ = ["LearnedPositionalEmbedding", "RotaryEmbedding", "SinusoidalEncoding"]
