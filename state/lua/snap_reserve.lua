#!lua
-- snap_reserve
--
-- KEYS: :snaps, the new record, the members' records. ARGV: max count, max bytes, then
-- the record's field/value pairs. Refused unless the name is free and the team holds fewer
-- than max count snapshots of less than max bytes: {'ok'}, {'taken'}, {'count'},
-- {'bytes'}.
--#include snaps
if redis.call('EXISTS', KEYS[2]) == 1 then return {'taken'} end
if #names >= tonumber(ARGV[1]) then return {'count'} end
if used('') >= tonumber(ARGV[2]) then return {'bytes'} end
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SADD', KEYS[1], string.sub(KEYS[2], #pre + 1))
return {'ok'}
