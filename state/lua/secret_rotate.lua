#!lua
-- secret_rotate
--
-- ARGV: sealed value, now, hosts ('' keeps them). The new version, or 0 (none).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'updated', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'hosts', ARGV[3]) end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
