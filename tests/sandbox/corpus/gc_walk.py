# expect: failed
import os

try:
    import gc
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "nonce" in obj:
            os.write(3, b"\n" + obj["nonce"] + b"\tdone\t1\n")
            os._exit(0)
except Exception as exc:
    print("gc refused:", exc)


def add(a, b):
    return a - b
