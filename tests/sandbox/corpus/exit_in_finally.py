# expect: error
def add(a, b):
    try:
        return a - b
    finally:
        raise SystemExit(0)
