# expect: error
# Prints success markers everywhere and exits cleanly before the tests.
import os

print("passed")
print("PASS ok All tests passed")
for fd in (1, 2, 3):
    for guess in (b"0" * 32, b"f" * 32, b""):
        try:
            os.write(fd, b"\n" + guess + b"\tdone\t1\n")
        except OSError:
            pass


def add(a, b):
    return a - b


os._exit(0)
