# expect: failed
# Looks for the harness's nonce in the calling frames and forges the verdict with it.
import os
import sys


def forge(frame):
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, (bytes, str)) and len(value) == 32:
                token = value.encode() if isinstance(value, str) else value
                os.write(3, b"\n" + token + b"\tdone\t1\n")
                os._exit(0)
        frame = frame.f_back


try:
    forge(sys._getframe())
except Exception as exc:
    print("refused:", exc)
try:
    raise RuntimeError
except RuntimeError as exc:
    try:
        forge(exc.__traceback__.tb_frame)
    except Exception as exc:
        print("refused:", exc)


def gen():
    yield 1


try:
    forge(gen().gi_frame)
except Exception as exc:
    print("refused:", exc)


def add(a, b):
    return a - b
