#!lua flags=allow-oom
-- tm_resumed
--
-- paused -> running: {1, idle_ms or 0}, else {0}.
if redis.call('HGET', KEYS[1], 'state') ~= 'paused' then return {0} end
redis.call('HSET', KEYS[1], 'state', 'running')
redis.call('HDEL', KEYS[1], 'paused_at')
return {1, tonumber(redis.call('HGET', KEYS[1], 'idle_ms') or '0') or 0}
