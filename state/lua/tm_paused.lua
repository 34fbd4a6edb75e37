#!lua flags=allow-oom
-- tm_paused
--
-- ARGV: now. running -> paused (paused_at): {1, auto_delete_seconds or 0}, else {0}.
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return {0} end
redis.call('HSET', KEYS[1], 'state', 'paused', 'paused_at', ARGV[1])
return {1, tonumber(redis.call('HGET', KEYS[1], 'auto_delete_seconds') or '0') or 0}
