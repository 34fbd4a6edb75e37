#!lua
-- guard_done
--
-- ARGV: reply (may be empty: too large to keep), ttl (s), now (ms), the team's budget
-- (bytes), job id. A reply is kept while the team is under its budget (so it overshoots by
-- at most one reply per job in flight, and then its new jobs are refused); at the budget
-- it is not kept (a repeat is told so). Returns the other reply topic a repeat of the job
-- named while it ran, or ''.
local also = redis.call('HGET', KEYS[1], 'also') -- no allow-oom: as before, a full Redis refuses it
local reply, n, ttl = ARGV[1], string.len(ARGV[1]), tonumber(ARGV[2]) * 1000
if n > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[4]) then
  reply, n = '', 0
end
redis.call('HSET', KEYS[1], 'state', 'done', 'reply', reply)
redis.call('EXPIRE', KEYS[1], ARGV[2])
if n > 0 then
  redis.call('ZADD', KEYS[2], tonumber(ARGV[3]) + ttl, ARGV[5] .. ':' .. n)
  redis.call('INCRBY', KEYS[3], n)
  for i = 2, 3 do
    if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
end
return also or ''
