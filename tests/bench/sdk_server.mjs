// The baseline for tests/bench/gateway.sh: the official MCP TypeScript SDK server, stateful
// (one transport per session) with JSON responses, on Node's HTTP/1.1 server. It answers
// tools/list with the exact result the gateway serves (read from TOOLS_JSON, so the bodies
// are the same size) and ping. Usage: node sdk_server.mjs TOOLS_JSON PORT_FILE
import http from 'node:http';
import fs from 'node:fs';
import { randomUUID } from 'node:crypto';
import { fileURLToPath, pathToFileURL } from 'node:url';
import path from 'node:path';

// The SDK the end-to-end suites install (tests/e2e/node_modules).
const sdk = path.join(path.dirname(fileURLToPath(import.meta.url)),
  '../e2e/node_modules/@modelcontextprotocol/sdk/dist/esm');
const load = (p) => import(pathToFileURL(path.join(sdk, p)).href);
const { Server } = await load('server/index.js');
const { StreamableHTTPServerTransport } = await load('server/streamableHttp.js');
const { ListToolsRequestSchema, isInitializeRequest } = await load('types.js');

const [toolsFile, portFile] = process.argv.slice(2);
const tools = JSON.parse(fs.readFileSync(toolsFile, 'utf8'));
const transports = new Map();

function newServer() {
  const s = new Server({ name: 'sdk-baseline', version: '1.0.0' }, { capabilities: { tools: {} } });
  s.setRequestHandler(ListToolsRequestSchema, async () => tools);
  return s;
}

const httpServer = http.createServer(async (req, res) => {
  let body = '';
  for await (const chunk of req) body += chunk;
  const msg = body ? JSON.parse(body) : undefined;
  const sid = req.headers['mcp-session-id'];
  let t = sid && transports.get(sid);
  if (!t) {
    if (!msg || !isInitializeRequest(msg)) {
      res.writeHead(400).end('{"error":"no session"}');
      return;
    }
    t = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      enableJsonResponse: true,
      onsessioninitialized: (id) => transports.set(id, t),
    });
    await newServer().connect(t);
  }
  await t.handleRequest(req, res, msg);
});
httpServer.keepAliveTimeout = 60000;
httpServer.listen(0, '127.0.0.1', () => fs.writeFileSync(portFile, String(httpServer.address().port)));
