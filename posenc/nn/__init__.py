"""Thin ``torch.nn`` modules over :mod:`posenc.functional`."""

from posenc.nn.alibi import AlibiBias
from posenc.nn.learned import LearnedPositionalEmbedding
from posenc.nn.relative import RelativePositionBias
from posenc.nn.rotary import RotaryEmbedding
from posenc.nn.sinusoidal import SinusoidalEncoding

__all__ = ["AlibiBias", "LearnedPositionalEmbedding", "RelativePositionBias", "RotaryEmbedding", "SinusoidalEncoding"]
