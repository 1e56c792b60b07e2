"""Private torch-side plumbing shared by :mod:`posenc.functional`, :mod:`posenc.nn` and the kernels.

- :mod:`~posenc._torch.checks`: argument checks of tensors, positions and offsets, raising
  ``TypeError``/``ValueError`` that name the argument and the fix;
- :mod:`~posenc._torch.angles`: exact angles on torch tensors and the working precision;
- :mod:`~posenc._torch.rows`: positions' range, table-row lookup and broadcasting;
- :mod:`~posenc._torch.engine_choice`: the one decision between the torch engine and the Triton kernel.

A public call validates its arguments and resolves its engine here, once; the layers beneath it
take the checked values.
"""
