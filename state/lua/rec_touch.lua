#!lua flags=allow-oom
-- rec_touch
--
-- ARGV: now. last_active, if the record exists. 1, or 0.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'last_active', ARGV[1])
return 1
