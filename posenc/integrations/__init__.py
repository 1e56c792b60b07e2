"""Adapters that put posenc into other libraries' models.  Nothing here is imported by ``import posenc``.

- :mod:`posenc.integrations.transformers`: ``patch_model`` for Hugging Face transformers models.
"""
