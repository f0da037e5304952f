# expect: output_limit
import sys

chunk = "x" * (1 << 20)
for _ in range(100):
    sys.stdout.write(chunk)
    sys.stdout.flush()


def add(a, b):
    return a + b
