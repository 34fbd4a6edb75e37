#!lua flags=allow-oom
-- tpl_del_undo
--
-- KEYS: a team template. ARGV: the delete's job. The delete was refused: the status it had
-- again (ready when a host has it ready: a build that ended meanwhile counts). 1, or 0
-- when it is not that delete's.
local v = redis.call('HMGET', KEYS[1], 'status', 'deljob', 'before')
if v[1] ~= 'deleting' or v[2] ~= ARGV[1] then return 0 end
local st = v[3] or 'ready'
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  if string.sub(h[i], 1, 3) == 'at:' and h[i + 1] == 'ready' then st = 'ready' end
end
redis.call('HSET', KEYS[1], 'status', st)
redis.call('HDEL', KEYS[1], 'before', 'deljob')
return 1
