#!lua flags=allow-oom
-- sess_team
--
-- KEYS: sf:team:{<team>}:sessions. ARGV: sid, now, ttl (s), the team's most. The new
-- session joins the team's; expired ones leave, and the least recently used beyond the
-- limit: answers their ids (the caller deletes their sessions).
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl * 1000)
local over, out = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4]) + 1, {}
if over > 0 then
  out = redis.call('ZRANGE', KEYS[1], 0, over - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 1000)
return out
