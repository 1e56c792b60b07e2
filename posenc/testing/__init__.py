"""Check what a positional encoding computes: probes, reports and assertions for test suites.

- :func:`inspect_rope` calls a rotary implementation on chosen inputs and reports what it computes
  (rotated features, pair layout, direction, frequencies and the closest known rule, attention
  factor, relative property, decode consistency, precision per dtype and position range);
  :func:`assert_rope_close` is its test-suite form against a reference.
- :func:`inspect_bias` does the same for attention-logit biases (ALiBi slopes, T5 buckets) and
  :func:`inspect_table` for sinusoidal tables.
- :func:`audit_hf` (and ``posenc audit``) reads a Hugging Face configuration or model and says what
  positions each layer gets, flags inconsistent fields, and inspects the model's rotary code.
"""

from posenc.testing._fit import RuleFit
from posenc.testing.audit import AuditReport, ModuleCheck, audit_hf
from posenc.testing.bias import BiasReport, inspect_bias
from posenc.testing.compare import assert_rope_close
from posenc.testing.rope import PrecisionRow, RopeReport, inspect_rope
from posenc.testing.table import TableReport, inspect_table

__all__ = ["AuditReport", "BiasReport", "ModuleCheck", "PrecisionRow", "RopeReport", "RuleFit", "TableReport",
           "assert_rope_close", "audit_hf", "inspect_bias", "inspect_rope", "inspect_table"]
