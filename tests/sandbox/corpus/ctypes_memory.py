# expect: failed
try:
    import ctypes
    libc = ctypes.CDLL(None)
    libc.setuid(0)
    print("ctypes loaded", ctypes.string_at(id(object()), 16))
except Exception as exc:
    print("ctypes refused:", exc)


def add(a, b):
    return a - b
