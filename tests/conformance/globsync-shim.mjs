// Node 20 has no fs.globSync, which @modelcontextprotocol/conformance 0.1.16 imports (it is
// used only by its tier-check command). Loaded with `node --import`, this resolve hook
// hands that package an `fs` that also exports a small globSync ("**/NAME" and "NAME").
import { register } from 'node:module';

const shim = `
import fs from 'node:fs';
import path from 'node:path';
export * from 'node:fs';
export default fs;
export function globSync(pattern, opts = {}) {
  const cwd = opts.cwd || process.cwd(), out = [];
  const name = pattern.replace(/^\\*\\*\\//, ''), deep = pattern.startsWith('**/');
  const walk = (dir, rel) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const r = rel ? rel + '/' + e.name : e.name;
      if (e.isDirectory() && deep) walk(path.join(dir, e.name), r);
      else if (e.name === name) out.push(r);
    }
  };
  walk(cwd, '');
  return out;
}`;

register('data:text/javascript,' + encodeURIComponent(`
export async function resolve(spec, ctx, next) {
  if ((spec === 'fs' || spec === 'node:fs') && !(ctx.parentURL || '').startsWith('data:'))
    return { url: 'data:text/javascript,' + encodeURIComponent(${JSON.stringify(shim)}), shortCircuit: true };
  return next(spec, ctx);
}`));
