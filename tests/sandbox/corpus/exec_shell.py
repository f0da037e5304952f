# expect: failed,error
import os

for attempt in (lambda: os.system("touch @@OUTSIDE@@/@@MARKER@@"),
                lambda: os.posix_spawn("/bin/sh", ["sh", "-c", "touch @@OUTSIDE@@/@@MARKER@@"], {}),
                lambda: os.execv("/bin/sh", ["sh", "-c", "touch @@OUTSIDE@@/@@MARKER@@ /tmp/@@MARKER@@"])):
    try:
        attempt()
    except Exception as exc:
        print("refused:", exc)


def add(a, b):
    return a - b
