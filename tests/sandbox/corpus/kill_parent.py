# expect: failed,error
import os

for target in (os.getppid(), 1, -1, 0):
    try:
        os.kill(target, 9) if target != 0 else os.killpg(os.getpgid(os.getppid()), 9)
    except OSError:
        pass


def add(a, b):
    return a - b
