# expect: error
import threading


def add(a, b):
    return a + b


while True:
    threading.Thread(target=lambda: __import__("time").sleep(60)).start()
