#!lua flags=allow-oom
-- rec_unset
--
-- ARGV: fields to delete while the record is live (a preview port closed). 1, or 0.
--#include dead
local st = redis.call('HGET', KEYS[1], 'state')
if not st or dead(st) then return 0 end
redis.call('HDEL', KEYS[1], unpack(ARGV))
return 1
