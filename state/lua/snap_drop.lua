#!lua flags=allow-oom
-- snap_drop
--
-- KEYS: the record, :snaps. ARGV: id, name. The record goes if it is still id's: 1, or 0.
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
