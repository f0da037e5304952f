# expect: failed
# A signal handler receives the interrupted frame: a way around sys._getframe.
import os

try:
    import signal

    def handler(signum, frame):
        while frame is not None:
            nonce = frame.f_locals.get("nonce")
            if nonce:
                os.write(3, b"\n" + nonce + b"\tdone\t1\n")
            frame = frame.f_back

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
except Exception as exc:
    print("signal refused:", exc)


def add(a, b):
    return a - b
