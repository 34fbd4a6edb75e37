#!lua flags=no-writes
-- snap_find
--
-- KEYS: :snaps and the members' records. ARGV: a name or an id. Its fields (HGETALL), or
-- {} when the team has none such.
--#include snaps
local n = find(ARGV[1])
if not n then return {} end
return redis.call('HGETALL', rk[n])
