#!lua flags=allow-oom
-- rec_retire
--
-- Retires it (killed, lost, failed): no metadata, `retired` = now, kept ttl seconds. With
-- only_live ('1'), a record already dead stays as it is and one being killed becomes
-- `killed`. Answers {1, team, host} (retired), {0, team, host} (already dead: the caller
-- still clears its team's and host's entries, which heals a retire cut short), {0} (no
-- record).
--#include dead
local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')
if not v[1] then return {0} end
local state, only = ARGV[3], ARGV[4] == '1'
if only and dead(v[3]) then return {0, v[1], v[2] or ''} end
if only and v[3] == 'killing' then state = 'killed' end
redis.call('HDEL', KEYS[1], 'metadata')
redis.call('HSET', KEYS[1], 'state', state, 'retired', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {1, v[1], v[2] or ''}
