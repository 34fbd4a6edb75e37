#!lua flags=allow-oom
-- rec_killing
--
-- A live record (creating, running, paused) becomes `killing`: {1, team, host}, else {0}.
local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')
if v[3] ~= 'creating' and v[3] ~= 'running' and v[3] ~= 'paused' then return {0} end
redis.call('HSET', KEYS[1], 'state', 'killing')
return {1, v[1], v[2] or ''}
