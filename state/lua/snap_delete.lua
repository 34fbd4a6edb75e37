#!lua flags=allow-oom
-- snap_delete
--
-- KEYS: :snaps and the members' records. ARGV: a name or an id. Deletes it unless it is
-- being taken: {'ok', id, name, host}, {'none'}, {'taking'}.
--#include snaps
local n = find(ARGV[1])
if not n then return {'none'} end
local v = redis.call('HMGET', rk[n], 'id', 'status', 'host')
if v[2] == 'taking' then return {'taking'} end
redis.call('DEL', rk[n])
redis.call('SREM', KEYS[1], n)
return {'ok', v[1] or '', n, v[3] or ''}
