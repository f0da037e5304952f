# expect: failed
# Patches builtins from inside the candidate, i.e. while the check is running.
def add(a, b):
    import builtins
    import math
    builtins.abs = lambda x: 0
    math.isclose = lambda *args, **kwargs: True
    return 5
