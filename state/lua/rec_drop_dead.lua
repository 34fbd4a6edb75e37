#!lua flags=allow-oom
-- rec_drop_dead
--
-- An old tombstone beyond its team's bound: deleted if still dead (not re-used).
--#include dead
if dead(redis.call('HGET', KEYS[1], 'state')) then return redis.call('DEL', KEYS[1]) end
return 0
