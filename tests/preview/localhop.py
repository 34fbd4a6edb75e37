#!/usr/bin/python3
"""localhop.py PATH: speaks the worker's local hop (docs/internals/ingress.md) for
tests/preview/local_hop.test.mjs, as a gateway on the same machine would: one JSON command
per stdin line, one JSON answer per stdout line. Node cannot receive SCM_RIGHTS; Python
can. Commands:
  {"op": "hop", "line": "SFHOP1 ...\\n", "send": "GET / ...", "keep": false}
      a new connection to PATH, the line, the answer: {"head", "fd": bool, "early"}; with
      "send": that request written on the passed socket and what came back until it closed
      (10 s at most) in "body"; with "keep": the connection and the socket are kept
      ("i": their index) until "close". A connection refused or denied: {"error": errno name}.
  {"op": "close", "i": n}          closes kept hop n (its connection and its socket)
  {"op": "eof", "i": n, "ms": t}   waits up to t ms for kept hop n's socket to end:
                                   {"eof": bool, "ms": elapsed}
  {"op": "count"}                  {"n": kept hops}
"""
import array
import errno
import json
import os
import select
import socket
import sys
import time

PATH = sys.argv[1]
kept = {}
next_i = 0


def answer(s, deadline):
    buf, fds = b"", []
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            break
        fda = array.array("i")
        try:
            msg, anc, _flags, _addr = s.recvmsg(70000, socket.CMSG_SPACE(4 * fda.itemsize))
        except OSError:
            break
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fda.frombytes(data[: len(data) - (len(data) % fda.itemsize)])
                fds.extend(fda)
        if not msg:
            break
        buf += msg
    head, _, rest = buf.partition(b"\n")
    return head.decode("latin1"), rest, fds


def read_all(fd, deadline):
    out = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return out
        try:
            d = os.read(fd, 65536)
        except OSError:
            return out
        if not d:
            return out
        out += d


def do(cmd):
    global next_i
    op = cmd["op"]
    if op == "hop":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(PATH)
        except OSError as e:
            s.close()
            return {"error": errno.errorcode.get(e.errno, str(e.errno))}
        try:
            s.sendall(cmd["line"].encode("latin1"))
        except OSError:
            pass  # turned away: what it answered (nothing) is read below
        head, rest, fds = answer(s, time.monotonic() + 20)
        r = {"head": head, "fd": len(fds) > 0, "fds": len(fds), "early": rest.decode("latin1")}
        if fds and cmd.get("send"):
            os.write(fds[0], cmd["send"].encode("latin1"))
            r["body"] = read_all(fds[0], time.monotonic() + 10).decode("latin1")
        if cmd.get("keep") and fds:
            kept[next_i] = (s, fds[0])
            r["i"] = next_i
            next_i += 1
            for fd in fds[1:]:
                os.close(fd)
        else:
            for fd in fds:
                os.close(fd)
            s.close()
        return r
    if op == "close":
        s, fd = kept.pop(cmd["i"])
        os.close(fd)
        s.close()
        return {"ok": True}
    if op == "eof":
        _s, fd = kept[cmd["i"]]
        t0 = time.monotonic()
        deadline = t0 + cmd["ms"] / 1000
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return {"eof": False, "ms": (time.monotonic() - t0) * 1000}
            try:
                d = os.read(fd, 65536)
            except OSError:
                d = b""
            if not d:
                return {"eof": True, "ms": (time.monotonic() - t0) * 1000}
    if op == "count":
        return {"n": len(kept)}
    return {"error": "unknown op"}


for raw in sys.stdin:
    if not raw.strip():
        continue
    try:
        res = do(json.loads(raw))
    except Exception as e:  # a test helper: the test sees what went wrong
        res = {"error": repr(e)}
    sys.stdout.write(json.dumps(res) + "\n")
    sys.stdout.flush()
