// The real MCP clients the suites drive besides the SDK (tests/e2e/package.json pins them;
// ops/test installs them with `npm ci`): the command-line ones (mcp-remote, the MCP
// Inspector, Claude Code, Codex) are found here; the libraries (LangChain's adapters,
// mcp-use, the AI SDK) are imported. A suite that needs one and finds it missing fails and
// says how to install it: no client is skipped.
import { accessSync, constants } from 'node:fs';
import { resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

// clientBin(ENV, NAME): $ENV if set, else node_modules/.bin/NAME; throws one sentence when
// that is not an executable file.
export function clientBin(envName, name) {
  const bin = process.env[envName] || resolve(here, 'node_modules/.bin', name);
  try {
    accessSync(bin, constants.X_OK);
  } catch {
    throw new Error(`${name} is not installed at ${bin}: run \`npm ci\` in tests/e2e (ops/test does), ` +
      `or point ${envName} at a ${name} binary`);
  }
  return bin;
}
