#!lua flags=allow-oom
-- rec_started
--
-- ARGV: the host it runs on, then field, value... state=running plus the fields, only
-- while the record exists, is live and names that host. 1, or 0.
--#include dead
local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')
if not v[1] or dead(v[3]) or (v[2] and v[2] ~= ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', unpack(ARGV, 2))
return 1
