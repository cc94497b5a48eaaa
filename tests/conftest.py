"""Suite-wide settings.

Hypothesis's per-example deadline is a wall-clock bound: on a loaded 2-core host one example
can take 500 ms for reasons that have nothing to do with the code (a CI run failed that way),
so no property test here asserts speed. Tests that want their own deadline still set it.
"""

from hypothesis import settings

settings.register_profile("sglang-slo", deadline=None)
settings.load_profile("sglang-slo")
