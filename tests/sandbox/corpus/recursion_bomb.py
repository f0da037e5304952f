# expect: error,memory,timeout
import sys

sys.setrecursionlimit(10 ** 6)


def add(a, b):
    return add(a, b)
