#!lua flags=allow-oom
-- team_release
--
-- KEYS: the team's sandboxes, res, retired. ARGV: id, now, ttl (s), keep, tombstone
-- ('1'). The sandbox leaves the team's set and gives back the team's reservation (each
-- at most once: both are keyed by the id); with a tombstone it joins the team's retired
-- list, trimmed to ttl and keep: answers the ids dropped from it (the caller deletes their
-- records), else {}.
local id = ARGV[1]
redis.call('SREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
if ARGV[5] ~= '1' then return {} end
local now, ttl, keep = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZADD', KEYS[3], now, id)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - ttl * 1000)
local out, over = {}, redis.call('ZCARD', KEYS[3]) - keep
if over > 0 then
  out = redis.call('ZRANGE', KEYS[3], 0, over - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
end
redis.call('PEXPIRE', KEYS[3], ttl * 1000)
return out
