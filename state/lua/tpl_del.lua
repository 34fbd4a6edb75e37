#!lua flags=allow-oom
-- tpl_del
--
-- KEYS: a team template, its log, the team's :tpls. ARGV: its name. Deletes them; answers
-- the hosts that hold (or were building) it.
local hosts, seen = {}, {}
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  local host = nil
  if h[i] == 'host' then host = h[i + 1] end
  if string.sub(h[i], 1, 3) == 'at:' then host = string.sub(h[i], 4) end
  if host and host ~= '' and not seen[host] then
    seen[host] = true
    table.insert(hosts, host)
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return hosts
