"""What a plain ``import posenc`` costs: no compiler stack (``torch._dynamo``, sympy, inductor) and no
Triton until a traced or GPU path needs them."""

from __future__ import annotations

import subprocess
import sys

EAGER_USE = """
import sys, torch
HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "triton", "torch.fx.experimental.symbolic_shapes")
import posenc, posenc.functional, posenc.nn
for name in posenc.__all__:
    getattr(posenc, name)
for name in posenc.functional.__all__:
    getattr(posenc.functional, name)
q = torch.randn(1, 2, 3, 8)
rope = posenc.RotaryEmbedding(8)
rope(q, q.clone()); rope(q, offset=5); rope(q, positions=torch.arange(3))
posenc.apply_rope_qk(q, None, rope.cos_table, rope.sin_table)
posenc.attention(q, q, q, encoding=rope, causal=True)
posenc.attention(q, q, q, encoding=posenc.AlibiBias(2), causal=True)
posenc.attention(q, q, q, encoding=posenc.RelativePositionBias(2), causal=True)
posenc.SinusoidalEncoding(8)(torch.randn(1, 3, 8))
posenc.sincos_table_nd((2, 2), 8)
print(sorted({m.split(".")[0] if m.split(".")[0] in ("sympy", "triton") else m for m in sys.modules
              if m.startswith(HEAVY)}))
"""


def test_a_plain_import_and_eager_calls_load_no_compiler_stack():
    out = subprocess.run([sys.executable, "-c", EAGER_USE], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"eager use of posenc imported: {out.strip()}"
