#!lua flags=no-writes
-- snap_list
--
-- KEYS: :snaps and the members' records. Each record's fields (HGETALL), by name.
--#include snaps
table.sort(names)
local out = {}
for _, n in ipairs(names) do table.insert(out, redis.call('HGETALL', rk[n])) end
return out
