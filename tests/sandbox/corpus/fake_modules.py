# expect: failed
import sys
import types

fake = types.ModuleType("math")
fake.isclose = lambda *args, **kwargs: True
sys.modules["math"] = fake


def add(a, b):
    return 5
