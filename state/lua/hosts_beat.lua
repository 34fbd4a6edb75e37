#!lua flags=allow-oom
-- hosts_beat
--
-- KEYS: sf:hosts. ARGV: host, now (ms). The host's last heartbeat (lands when Redis is
-- full: a full Redis must not make a live host look dead).
return redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
