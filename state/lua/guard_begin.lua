#!lua
-- guard_begin
--
-- ARGV: host, instance, ttl (s), reply topic, now (ms), the team's budget (bytes), force
-- ('1': a kill, which frees room, is never refused). Returns {'new'}, {'full', bytes}
-- (the team's kept replies fill its budget: nothing written), {'running'} (this process
-- runs it: it answers; a second reply topic is kept in `also`), {'done', reply} or
-- {'orphan', host} (a worker process that is gone ran it). Kept replies that expired give
-- their bytes back here (at most 256 a call: cheap, and the rest on the next ones).
local v = redis.call('HMGET', KEYS[1], 'state', 'host', 'inst', 'reply', 'topic') -- no allow-oom: a full Redis refuses it whole
if not v[1] then
  local now = tonumber(ARGV[5])
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)
  if #gone > 0 then
    local freed = 0
    for _, m in ipairs(gone) do
      freed = freed + (tonumber(string.match(m, ':(%d+)$')) or 0)
      redis.call('ZREM', KEYS[2], m)
    end
    if redis.call('DECRBY', KEYS[3], freed) <= 0 then redis.call('DEL', KEYS[3]) end
  end
  local used = tonumber(redis.call('GET', KEYS[3]) or '0')
  if ARGV[7] ~= '1' and used >= tonumber(ARGV[6]) then return {'full', used} end
  redis.call('HSET', KEYS[1], 'state', 'running', 'host', ARGV[1], 'inst', ARGV[2], 'topic', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return {'new'}
end
if v[1] == 'done' then return {'done', v[4] or ''} end
if v[3] == ARGV[2] then
  if v[5] ~= ARGV[4] then redis.call('HSET', KEYS[1], 'also', ARGV[4]) end
  return {'running'}
end
return {'orphan', v[2] or ''}
