# expect: failed
import os

targets = ["/tmp/@@MARKER@@", "/var/tmp/@@MARKER@@", "/dev/shm/@@MARKER@@", "@@REPO@@/@@MARKER@@",
           "@@OUTSIDE@@/@@MARKER@@", "/@@MARKER@@", os.path.expanduser("~/@@MARKER@@"), "/etc/@@MARKER@@"]
for path in targets:
    try:
        with open(path, "w") as f:
            f.write("pwned")
    except OSError:
        pass
try:
    os.chmod("@@OUTSIDE@@", 0o000)
except OSError:
    pass


def add(a, b):
    return a - b
