#!lua
-- rec_set
--
-- ARGV: field, value, ... set while the record is live. 1, or 0.
--#include dead
local st = redis.call('HGET', KEYS[1], 'state')
if not st or dead(st) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
