# expect: failed
import os

for path in ["@@SENTINEL@@", "@@OUTSIDE@@/keep.txt"]:
    try:
        os.remove(path)
    except OSError:
        pass
    try:
        os.rename(path, path + ".moved")
    except OSError:
        pass
    try:
        with open(path, "w") as f:
            f.write("overwritten")
    except OSError:
        pass
try:
    os.rmdir("@@OUTSIDE@@")
except OSError:
    pass


def add(a, b):
    return a - b
