#!lua flags=allow-oom
-- tpl_set
--
-- KEYS: a team template. ARGV: job, field, value, now. 1, or 0 (not that job's).
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3], 'updated', ARGV[4])
return 1
