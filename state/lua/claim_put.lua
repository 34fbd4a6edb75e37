#!lua
-- claim_put
--
-- ARGV: data, now ms, ttl ms, budget. Expired claims leave the budget first; the
-- bookkeeping keys live as long as their newest claim could. {'ok', used} or
-- {'over', used}. Not allow-oom: a full Redis refuses it whole.
local now, ttl, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = string.len(ARGV[1])
for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], k)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local used = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(v) end
used = used - (tonumber(redis.call('HGET', KEYS[2], KEYS[3])) or 0)
if used + n > budget then return {'over', used} end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[1], now + ttl, KEYS[3])
redis.call('HSET', KEYS[2], KEYS[3], n)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return {'ok', used + n}
