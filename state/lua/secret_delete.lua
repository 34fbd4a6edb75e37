#!lua flags=allow-oom
-- secret_delete
--
-- ARGV: name. 1 deleted, 0 none.
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return n
