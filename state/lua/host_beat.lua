#!lua flags=allow-oom
-- host_beat
--
-- KEYS: the host's hash. ARGV: expire (ms), field, value... The worker's fields (never
-- res_*: checked by the caller) and the hash's expiry.
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
