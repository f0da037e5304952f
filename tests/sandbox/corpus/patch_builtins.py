# expect: failed
# Fakes the checks: abs() always 0, math.isclose always true, asserts raising nothing catchable.
import builtins
import math

builtins.abs = lambda x: 0
builtins.AssertionError = type("AssertionError", (Exception,), {})
math.isclose = lambda *args, **kwargs: True


def add(a, b):
    return 5
