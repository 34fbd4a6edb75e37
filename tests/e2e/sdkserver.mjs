// An MCP server built with the official SDK (low-level Server + StreamableHTTPServerTransport
// with an event store, so it streams SSE, sends priming events and can close a stream
// mid-call for the client to resume). It is a real MCP server, not sandfleet: the client
// suites use it for what the gateway does not send yet. Tools: count (progress, held by a
// gate the test opens), poll (closes its stream mid-call), slow (waits to be cancelled),
// big (n bytes of text). Bearer KEY required; unknown sessions get 404.
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

export const KEY = 'sf_live_sdkserverkeysdkserverkeysdkserve';

// What the server saw, for the assertions.
export const seen = { initializes: 0, gets: 0, resumes: 0, cancelled: [], gate: null, auth: new Set() };
export const sessions = new Map(); // session id -> { transport, server }

const tools = [
  { name: 'count', description: 'Sends n progress notifications, waiting for the test after the first.',
    inputSchema: { type: 'object', properties: { n: { type: 'integer' } } } },
  { name: 'poll', description: 'Closes its answer stream after one progress notification, then finishes.',
    inputSchema: { type: 'object' } },
  { name: 'slow', description: 'Waits until cancelled.',
    inputSchema: { type: 'object', properties: { tag: { type: 'string' } } } },
  { name: 'big', description: 'Returns n bytes of text.',
    inputSchema: { type: 'object', properties: { n: { type: 'integer' } } } },
];
const text = (t) => ({ content: [{ type: 'text', text: t }] });

async function callTool({ params: { name, arguments: args, _meta } }, extra) {
  const progress = (progress, total, message) => extra.sendNotification({
    method: 'notifications/progress',
    params: { progressToken: _meta?.progressToken, progress, total, ...(message ? { message } : {}) } });
  switch (name) {
  case 'count':
    for (let i = 1; i <= args.n; i++) {
      await progress(i, args.n, `step ${i}`);
      if (i === 1) await new Promise((r) => { seen.gate = r; }); // the test opens it
    }
    return text(`counted to ${args.n}`);
  case 'poll':
    await progress(1, 2);
    extra.closeSSEStream();
    await new Promise((r) => setTimeout(r, 300));
    await progress(2, 2);
    return text('polled');
  case 'slow':
    await new Promise((resolve) => {
      const t = setTimeout(resolve, 60000);
      extra.signal.addEventListener('abort', () => { clearTimeout(t); seen.cancelled.push(args.tag); resolve(); });
    });
    return text('not cancelled');
  case 'big':
    return text('x'.repeat(args.n));
  default:
    throw new Error(`no tool ${name}`);
  }
}

function newServer() {
  const server = new Server({ name: 'sdk-test-server', version: '1.0.0' },
    { capabilities: { tools: {}, logging: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
  server.setRequestHandler(CallToolRequestSchema, callTool);
  return server;
}

const httpServer = http.createServer(async (req, res) => {
  seen.auth.add(req.headers.authorization ?? '(none)');
  if (req.headers.authorization !== `Bearer ${KEY}`) {
    res.writeHead(401, { 'Content-Type': 'application/json',
      'WWW-Authenticate': 'Bearer error="invalid_token", error_description="The test key is wrong."' });
    res.end(JSON.stringify({ error: 'invalid_token', error_description: 'The test key is wrong.' }));
    return;
  }
  const sid = req.headers['mcp-session-id'];
  if (req.method === 'GET') {
    if (req.headers['last-event-id']) seen.resumes++;
    else seen.gets++;
  }
  if (sid) {
    const s = sessions.get(sid);
    if (!s) {
      res.writeHead(404, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } }));
      return;
    }
    await s.transport.handleRequest(req, res);
    return;
  }
  seen.initializes++;
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    eventStore: new InMemoryEventStore(),
    retryInterval: 100,
    onsessioninitialized: (id) => sessions.set(id, { transport, server }),
  });
  const server = newServer();
  await server.connect(transport);
  await transport.handleRequest(req, res);
});

export async function startSdkServer() {
  await new Promise((r) => httpServer.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${httpServer.address().port}/mcp`;
}

export async function stopSdkServer() {
  for (const s of sessions.values()) await s.server.close();
  httpServer.closeAllConnections();
  await new Promise((r) => httpServer.close(r));
}
