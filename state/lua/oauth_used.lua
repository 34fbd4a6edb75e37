#!lua flags=allow-oom
-- oauth_used
--
-- KEYS[1] the live zset; ARGV: member. It no longer counts (used, or consumed). Frees.
return redis.call('ZREM', KEYS[1], ARGV[1])
