#!/usr/bin/env python3
"""kafka_probe.py HOST:PORT BROKERS [TOPIC...]: one Kafka Metadata request (v1). Exits 0 when
the broker answers, names at least BROKERS live brokers, and each TOPIC has a leader for
every partition (with its ISR printed); 1 otherwise. ops/dev-cluster waits on it, never on
the clock. With KAFKA_PROBE_SASL_USER and KAFKA_PROBE_SASL_PASSWORD_FILE set, it first
authenticates with SASL/PLAIN (SaslHandshake v1, SaslAuthenticate v0) as that user."""
import os
import socket
import struct
import sys


def read_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b


def request(s, api, version, corr, payload):
    client = b"sf-dev-cluster"
    body = struct.pack(">hhih", api, version, corr, len(client)) + client + payload
    s.sendall(struct.pack(">i", len(body)) + body)
    (n,) = struct.unpack(">i", read_exact(s, 4))
    return read_exact(s, n)


def sasl_plain(s, user, password):
    mech = b"PLAIN"
    r = request(s, 17, 1, 1, struct.pack(">h", len(mech)) + mech)
    if struct.unpack_from(">h", r, 4)[0] != 0:
        raise EOFError
    token = b"\0" + user.encode() + b"\0" + password.encode()
    r = request(s, 36, 0, 2, struct.pack(">i", len(token)) + token)
    if struct.unpack_from(">h", r, 4)[0] != 0:
        raise EOFError


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    want, topics = int(sys.argv[2]), sys.argv[3:]
    client = b"sf-dev-cluster"
    body = struct.pack(">hhih", 3, 1, 7, len(client)) + client
    if topics:
        body += struct.pack(">i", len(topics))
        for t in topics:
            body += struct.pack(">h", len(t)) + t.encode()
    else:
        body += struct.pack(">i", -1)
    user = os.environ.get("KAFKA_PROBE_SASL_USER")
    with socket.create_connection((host, int(port)), timeout=2) as s:
        if user:
            with open(os.environ["KAFKA_PROBE_SASL_PASSWORD_FILE"]) as f:
                sasl_plain(s, user, f.read().strip())
        s.sendall(struct.pack(">i", len(body)) + body)
        (n,) = struct.unpack(">i", read_exact(s, 4))
        r, off = read_exact(s, n), 4

    def take(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, r, off)
        off += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal off
        ln = take(">h")
        if ln < 0:
            return None
        v = r[off:off + ln].decode()
        off += ln
        return v

    brokers = take(">i")
    for _ in range(brokers):
        take(">i"); string(); take(">i"); string()
    take(">i")  # controller
    ok = brokers >= want
    for _ in range(take(">i")):
        err, name, _internal = take(">h"), string(), take(">b")
        parts = take(">i")
        ok = ok and err == 0 and parts > 0
        for _ in range(parts):
            perr, _idx, leader = take(">hii")
            take(">" + "i" * take(">i"))
            isr = take(">i")
            take(">" + "i" * isr)
            ok = ok and perr == 0 and leader >= 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    try:
        main()
    except (OSError, EOFError, struct.error):
        sys.exit(1)
