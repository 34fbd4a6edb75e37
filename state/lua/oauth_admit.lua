#!lua
-- oauth_admit
--
-- ARGV: per minute (this address), most alive, now (ms), ttl (ms), member. Admits one more
-- entry: {'ok', 0}, or refuses it without writing: {'rate', s} (the address's minute is
-- used up; s until it ends) or {'full', s} (most alive; s until the oldest expires).
local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]) -- no allow-oom: a full Redis refuses it whole
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then
  local left = redis.call('TTL', KEYS[1])
  if left < 1 then left = 1 end
  return {'rate', left}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local left = math.ceil((tonumber(first[2]) - now) / 1000)
  if left < 1 then left = 1 end
  return {'full', left}
end
if redis.call('INCR', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], 60) end
redis.call('ZADD', KEYS[2], now + ttl, ARGV[5])
redis.call('PEXPIRE', KEYS[2], ttl)
return {'ok', 0}
