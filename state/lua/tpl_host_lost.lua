#!lua flags=allow-oom
-- tpl_host_lost
--
-- KEYS: a team template[, the team's res]. ARGV: host, why, now[, the template's name].
-- The host went down (the reaper): the build's part of the team's share there goes
-- (tb:<name>@<host>, worker/tpl_build.c); a build still `building` there is `failed` with
-- why (err:<host>; the template's error too when it has none), the status from every
-- host's as for tpl_done (left alone while a delete runs). 1, or 0 when it was not
-- building there.
--#include tpl_status
if KEYS[2] then redis.call('HDEL', KEYS[2], 'tb:' .. ARGV[4] .. '@' .. ARGV[1]) end
local at = 'at:' .. ARGV[1]
if redis.call('HGET', KEYS[1], at) ~= 'building' then return 0 end
redis.call('HSET', KEYS[1], at, 'failed', 'err:' .. ARGV[1], ARGV[2], 'updated', ARGV[3])
if not redis.call('HGET', KEYS[1], 'error') then redis.call('HSET', KEYS[1], 'error', ARGV[2]) end
if redis.call('HGET', KEYS[1], 'status') ~= 'deleting' then tpl_status(KEYS[1]) end
return 1
