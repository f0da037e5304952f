# expect: failed
try:
    with open("big.bin", "wb") as f:
        for _ in range(200):
            f.write(b"\0" * (1 << 20))
except OSError as exc:
    print("big file stopped:", exc)
try:
    for i in range(100000):
        open(f"f{i}", "w").close()
except OSError as exc:
    print("many files stopped:", exc)


def add(a, b):
    return a - b
