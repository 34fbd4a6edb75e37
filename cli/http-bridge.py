# http-bridge.py: runs a hosted MCP server that speaks Streamable HTTP (`sandfleet servers add
# --http PORT[/PATH]`) behind the worker's stdio bridge. It runs inside the session's sandbox:
#   python3 http-bridge.py PORT PATH COMMAND
# starts COMMAND (sh -c, its output to stderr: `sandfleet servers logs` shows it), then relays
# each JSON-RPC line from stdin as a POST to http://127.0.0.1:PORT/PATH and writes every
# message of the answer (JSON or SSE) as one line to stdout; the server's own stream (GET)
# too. When COMMAND exits, so does the bridge, with its status. Python 3 standard library only.
import http.client, json, os, socket, subprocess, sys, threading, time

port, path, command = int(sys.argv[1]), sys.argv[2], sys.argv[3]
out_lock = threading.Lock()
session = {"id": None, "version": None}
got_session = threading.Event()


def emit(msg):
    line = json.dumps(msg, separators=(",", ":"))
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def fail(msg_id, text):
    if msg_id is not None:
        emit({"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32603, "message": text}})


def headers(get=False):
    h = {"Accept": "text/event-stream" if get else "application/json, text/event-stream"}
    if not get:
        h["Content-Type"] = "application/json"
    if session["id"]:
        h["Mcp-Session-Id"] = session["id"]
    if session["version"]:
        h["MCP-Protocol-Version"] = session["version"]
    return h


def relay(resp, out=emit):
    """Every JSON-RPC message of an answer, as lines on stdout."""
    ctype = resp.getheader("Content-Type", "")
    if "text/event-stream" in ctype:
        data = []
        for raw in resp:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line == "" and data:
                try:
                    out(json.loads("\n".join(data)))
                except ValueError:
                    pass
                data = []
    elif "json" in ctype:
        body = resp.read()
        if body:
            msg = json.loads(body)
            for m in msg if isinstance(msg, list) else [msg]:
                out(m)
    else:
        resp.read()


def post(line):
    try:
        msg = json.loads(line)
    except ValueError:
        return
    msg_id = msg.get("id") if "method" in msg else None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=None)
        conn.request("POST", path, body=line.encode(), headers=headers())
        resp = conn.getresponse()
        sid = resp.getheader("Mcp-Session-Id")
        if sid and not session["id"]:
            session["id"] = sid
        if resp.status >= 400:
            fail(msg_id, "The server answered HTTP %d: %s" % (resp.status, resp.read(300).decode("utf-8", "replace")))
            return
        relay(resp, note if msg.get("method") == "initialize" else emit)
        conn.close()
    except OSError as e:
        fail(msg_id, "The server at 127.0.0.1:%d%s cannot be reached: %s" % (port, path, e))


def note(m):
    """initialize's answer: its protocol version goes on every later request."""
    v = m.get("result", {}).get("protocolVersion") if isinstance(m, dict) else None
    if v:
        session["version"] = v
    emit(m)


def listen():
    got_session.wait()
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=None)
            conn.request("GET", path, headers=headers(get=True))
            resp = conn.getresponse()
            if resp.status != 200:
                return  # the server offers no stream of its own (405)
            relay(resp)
        except OSError:
            pass
        time.sleep(0.5)  # the stream ended: open it again


def wait_port(proc):
    """Until the server accepts connections (or exits)."""
    while proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)


def watch(proc):
    os._exit(proc.wait() & 0xFF)


def main():
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=sys.stderr)
    threading.Thread(target=watch, args=(proc,), daemon=True).start()
    wait_port(proc)
    threading.Thread(target=listen, daemon=True).start()
    for line in sys.stdin:
        if not line.strip():
            continue
        if not got_session.is_set():  # initialize first, alone: later requests need its session
            post(line)
            got_session.set()
        else:
            threading.Thread(target=post, args=(line,), daemon=True).start()
    proc.terminate()


main()
