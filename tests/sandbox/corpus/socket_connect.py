# expect: failed
import socket

for address in [("127.0.0.1", @@PORT@@), ("1.1.1.1", 53)]:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(0.5)
        s.connect(address)
        s.sendall(b"pwned")
        print("CONNECTED", address)
    except OSError as exc:
        print("refused", address, exc)


def add(a, b):
    return a - b
