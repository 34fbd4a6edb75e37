# The sandbox's app for the preview browser suite (stdlib only; copied into a 'debian'
# sandbox and run there): GET / is a page that opens a WebSocket to /ws (echoed back) and an
# EventSource on /events (3 events, 1 s apart); POST /upload reads a body (Content-Length or chunked)
# and answers its size and SHA-256; GET /sleep/N answers after N seconds of silence; a
# WebSocket message "wait N" is echoed after N seconds of silence both ways. Usage:
# python3 app.py PORT
import base64, hashlib, http.server, json, struct, sys, time

PAGE = b"""<!doctype html><html><head><title>preview app</title></head><body>
<h1 id="t">preview app live</h1><pre id="ws">ws: waiting</pre><pre id="sse">sse: waiting</pre>
<script>
// as a dev server's hot-reload client: a socket that closes before its echo is opened
// again (Chromium drops connections when a host interface comes or goes: other sandboxes)
let tries = 0;
function open() {
  const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
  let echoed = false;
  ws.onopen = () => ws.send('hello over websocket');
  ws.onmessage = (e) => { echoed = true; document.getElementById('ws').textContent = 'echo: ' + e.data; };
  ws.onclose = (e) => {
    if (echoed) return;
    document.getElementById('ws').textContent = 'ws: closed ' + e.code + ' (try ' + ++tries + ')';
    if (tries < 5) setTimeout(open, 500);
  };
}
open();
const t0 = Date.now(), got = [];
const es = new EventSource('/events');
es.onmessage = (e) => {
  got.push(e.data + '@' + (Date.now() - t0));
  document.getElementById('sse').textContent = 'sse: ' + got.join(' ');
  if (got.length === 3) es.close();
};
</script></body></html>"""


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == '/ws' and self.headers.get('Upgrade', '').lower() == 'websocket':
            return self.websocket()
        if self.path.startswith('/sleep/'):
            time.sleep(float(self.path[7:]))
            body = b'slept ' + self.path[7:].encode()
            self.send_response(200)
            self.send_header('Content-Type', 'text/plain')
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == '/events':
            self.send_response(200)
            self.send_header('Content-Type', 'text/event-stream')
            self.send_header('Cache-Control', 'no-cache')
            self.send_header('Connection', 'close')
            self.end_headers()
            self.wfile.write(b'retry: 600000\n\n')
            for i in range(1, 4):
                self.wfile.write(b'data: event %d\n\n' % i)
                self.wfile.flush()
                if i < 3:
                    time.sleep(1)
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header('Content-Type', 'text/html')
        self.send_header('Content-Length', str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def do_POST(self):
        h, got = hashlib.sha256(), 0
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
            while True:  # (a body relayed from HTTP/2 without a length comes chunked)
                n = int(self.rfile.readline().split(b';')[0], 16)
                if n == 0:
                    while self.rfile.readline() not in (b'\r\n', b'\n', b''):
                        pass
                    break
                b = self.rfile.read(n)
                h.update(b)
                got += len(b)
                self.rfile.readline()
        else:
            n = int(self.headers.get('Content-Length', '0'))
            while got < n:
                b = self.rfile.read(min(65536, n - got))
                if not b:
                    break
                h.update(b)
                got += len(b)
        body = json.dumps({'bytes': got, 'sha256': h.hexdigest()}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def websocket(self):
        key = self.headers['Sec-WebSocket-Key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
        self.send_response(101)
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept',
                         base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        rf = self.rfile
        while True:
            h = rf.read(2)
            if len(h) < 2:
                break
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack('>H', rf.read(2))[0]
            elif n == 127:
                n = struct.unpack('>Q', rf.read(8))[0]
            mask = rf.read(4) if h[1] & 128 else b'\0\0\0\0'
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(rf.read(n)))
            if op == 8:
                break
            if op == 1 and data.startswith(b'wait '):
                time.sleep(float(data[5:]))
                data = b'waited ' + data[5:]
            if op == 1:
                head = bytes([0x81, len(data)]) if len(data) < 126 else \
                    bytes([0x81, 126]) + struct.pack('>H', len(data))
                self.wfile.write(head + data)
                self.wfile.flush()
        self.close_connection = True


http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
