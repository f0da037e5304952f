# expect: failed
def check(candidate):
    pass


def add(a, b):
    return a - b
