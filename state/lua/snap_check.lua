#!lua flags=allow-oom
-- snap_check
--
-- KEYS: the record, :snaps. ARGV: id, name, stale_taking. Is the record still id's (its
-- files are kept)? With stale_taking ('1'), one still `taking` goes (its worker restarted).
-- 1 keep, 0 gone.
local v = redis.call('HMGET', KEYS[1], 'id', 'status')
if v[1] ~= ARGV[1] then return 0 end
if v[2] == 'taking' and ARGV[3] == '1' then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[2])
  return 0
end
return 1
