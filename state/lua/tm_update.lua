#!lua flags=allow-oom
-- tm_update
--
-- sandbox_update's record part. ARGV: id, team, now, set metadata (1/0), metadata, timeout
-- (s, -1 keep, -2 reset), auto_delete (s, -1 keep, 0 none). Answers {verdict, state, host,
-- then the timer changes for the host's timers as (op, member, score) triples: 'a' add,
-- 'r' remove}. verdict: 'ok', 'none' (no such sandbox of the team), 'starting', 'dead'.
local id, now = ARGV[1], tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state', 'lifetime_at', 'paused_at')
if not v[1] or v[1] ~= ARGV[2] then return {'none', ''} end
local st = v[3] or ''
if st == 'creating' or not v[2] then return {'starting', st} end
if st ~= 'running' and st ~= 'paused' then return {'dead', st} end
local out = {'ok', st, v[2]}
local function op(o, m, s) table.insert(out, o) table.insert(out, m) table.insert(out, tostring(s)) end
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'metadata', ARGV[5]) end
local t, ad = tonumber(ARGV[6]), tonumber(ARGV[7])
if t == -2 then
  redis.call('HDEL', KEYS[1], 'timeout_seconds')
  local at = tonumber(v[4])
  if at then
    redis.call('HSET', KEYS[1], 'timeout_at', at)
    op('a', 't:' .. id, at)
  end
elseif t > 0 then
  redis.call('HSET', KEYS[1], 'timeout_seconds', t, 'timeout_at', now + t * 1000)
  op('a', 't:' .. id, now + t * 1000)
end
if ad == 0 then
  redis.call('HDEL', KEYS[1], 'auto_delete_seconds')
  op('r', 'd:' .. id, 0)
elseif ad > 0 then
  redis.call('HSET', KEYS[1], 'auto_delete_seconds', ad)
  if st == 'paused' and tonumber(v[5]) then op('a', 'd:' .. id, tonumber(v[5]) + ad * 1000) end
end
return out
