#!lua
-- sess_put
--
-- KEYS: sf:mcpsess:{<sid>}. ARGV: team, protocol, now, ttl (s). A new session: 1. Not
-- allow-oom: a full Redis refuses it.
redis.call('HSET', KEYS[1], 'team', ARGV[1], 'protocol', ARGV[2], 'created', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
