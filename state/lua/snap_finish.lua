#!lua flags=allow-oom
-- snap_finish
--
-- KEYS: :snaps, the record, the members' records. ARGV: id, size, max bytes, now. Taken:
-- `ready` with its size, unless the team would then hold more than max bytes (the record
-- goes): {'ok'}, {'bytes'}, {'gone'} (it is not id's any more).
--#include snaps
if redis.call('HGET', KEYS[2], 'id') ~= ARGV[1] then return {'gone'} end
local name = string.sub(KEYS[2], #pre + 1)
if used(name) + tonumber(ARGV[2]) > tonumber(ARGV[3]) then
  redis.call('DEL', KEYS[2])
  redis.call('SREM', KEYS[1], name)
  return {'bytes'}
end
redis.call('HSET', KEYS[2], 'status', 'ready', 'size', ARGV[2], 'ready_at', ARGV[4])
return {'ok'}
