# expect: error
import os

for fd in range(3, 64):
    try:
        os.close(fd)
    except OSError:
        pass


def add(a, b):
    return a + b
