#!/usr/bin/env node
// Writes docs/tools.md, the tool reference, from schemas/tools/*.json (the same schemas
// tools/list serves and every call is validated against).
//   node docs/gen-tools.mjs           rewrite docs/tools.md
//   node docs/gen-tools.mjs --check   exit 1 if docs/tools.md differs (a ctest case runs this)
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dir = join(root, 'schemas/tools');
const target = join(root, 'docs/tools.md');

const esc = (s) => String(s).replace(/\|/g, '\\|').replace(/\n/g, ' ');
const firstSentence = (s) => (s.match(/^.*?\.(\s|$)/) ?? [s])[0].trim();

function typeOf(p) {
  if (p.enum) return p.enum.map((v) => `\`${JSON.stringify(v)}\``).join(' \\| ');
  const t = Array.isArray(p.type) ? p.type.join(' \\| ') : p.type ?? 'any';
  if (t === 'object' && p.additionalProperties && typeof p.additionalProperties === 'object')
    return `map of ${typeOf(p.additionalProperties)}`;
  if (t === 'array' && p.items) return `array of ${typeOf(p.items)}`;
  return t;
}

function limitsOf(p) {
  const l = [];
  const range = (lo, hi, unit) => {
    if (lo !== undefined && hi !== undefined) l.push(`${lo}–${hi}${unit}`);
    else if (lo !== undefined) l.push(`≥ ${lo}${unit}`);
    else if (hi !== undefined) l.push(`≤ ${hi}${unit}`);
  };
  range(p.minLength, p.maxLength, ' chars');
  range(p.minimum, p.maximum, '');
  if (p.exclusiveMinimum !== undefined) l.push(`> ${p.exclusiveMinimum}`);
  if (p.exclusiveMaximum !== undefined) l.push(`< ${p.exclusiveMaximum}`);
  range(p.minItems, p.maxItems, ' items');
  if (p.maxProperties !== undefined) l.push(`≤ ${p.maxProperties} entries`);
  if (p.propertyNames?.maxLength !== undefined) l.push(`names ≤ ${p.propertyNames.maxLength} chars`);
  if (p.propertyNames?.pattern) l.push(`names \`${p.propertyNames.pattern}\``);
  if (p.pattern) l.push(`\`${p.pattern}\``);
  const inner = p.additionalProperties ?? p.items;
  if (inner && typeof inner === 'object' && inner.maxLength !== undefined)
    l.push(`values ≤ ${inner.maxLength} chars`);
  if (p.type === 'object' && p['x-maxBytes'] !== undefined) l.push(`≤ ${p['x-maxBytes']} bytes in all`);
  return l.join(', ');
}

function hints(a = {}) {
  const h = [];
  if (a.readOnlyHint) h.push('read-only');
  if (a.destructiveHint) h.push('destructive');
  if (a.idempotentHint) h.push('idempotent');
  if (a.openWorldHint) h.push('open world');
  return h.length ? h.join(', ') : 'changes state';
}

export function render() {
  const schemas = readdirSync(dir).filter((f) => f.endsWith('.json')).sort()
    .map((f) => JSON.parse(readFileSync(join(dir, f), 'utf8')));
  const out = [
    '# Tool reference',
    '',
    '<!-- Generated from schemas/tools/*.json by docs/gen-tools.mjs: edit the schemas, then run',
    '     `node docs/gen-tools.mjs`. A test fails when this file and the schemas differ. -->',
    '',
    'The tools of the sandfleet MCP endpoint, as `tools/list` serves them. Every call is',
    'checked against these schemas (by the gateway, and by the scheduler for jobs put on the',
    'queue directly); a call that does not fit is answered with `isError: true` and a sentence',
    'naming the field. A tool that acts on a sandbox names it (`sandbox_id`): there is no',
    '"current sandbox".',
    '',
    '| tool | what it does |',
    '| --- | --- |',
    ...schemas.map((s) => `| [\`${s.title}\`](#${s.title}) | ${esc(firstSentence(s.description))} |`),
  ];
  for (const s of schemas) {
    const a = s['x-annotations'] ?? {};
    out.push('', `## ${s.title}`, '', `**${esc(a.title ?? s.title)}** (${hints(a)}). ${s.description}`, '');
    const props = Object.entries(s.properties ?? {});
    if (!props.length) {
      out.push('No inputs.');
      continue;
    }
    const req = new Set(s.required ?? []);
    out.push('| input | type | required | limits | description |', '| --- | --- | --- | --- | --- |');
    for (const [name, p] of props)
      out.push(`| \`${name}\` | ${typeOf(p)} | ${req.has(name) ? 'yes' : 'no'} | ${esc(limitsOf(p))} | ${esc(p.description ?? '')} |`);
    if (s.additionalProperties === false) out.push('', 'Other inputs are refused.');
  }
  return `${out.join('\n')}\n`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const text = render();
  if (process.argv.includes('--check')) {
    let have = '';
    try { have = readFileSync(target, 'utf8'); } catch { /* missing: differs */ }
    if (have !== text) {
      console.error('docs/tools.md is out of date with schemas/tools/*.json: run `node docs/gen-tools.mjs` and commit the result.');
      process.exit(1);
    }
    console.log(`docs/tools.md matches the ${text.match(/^## /gm).length} tool schemas`);
  } else {
    writeFileSync(target, text);
    console.log('wrote docs/tools.md');
  }
}
