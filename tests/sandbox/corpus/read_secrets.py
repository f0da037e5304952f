# expect: failed
import os

print("ENV", dict(os.environ))
for path in ["/proc/1/environ", "/proc/self/environ", f"/proc/{os.getppid()}/environ", "/root/.aws/credentials",
             "/etc/shadow", "@@SENTINEL@@"]:
    try:
        with open(path, "rb") as f:
            print("READ", path, f.read(200))
    except OSError as exc:
        print("denied", path, exc)


def add(a, b):
    return a - b
