# expect: memory
hoard = []
while True:
    hoard.append(bytearray(50 * 1024 * 1024))


def add(a, b):
    return a + b
