#!lua flags=allow-oom
-- tpl_done
--
-- KEYS: a team template. ARGV: job, host, ready|failed, error, failed_step, now, lead
-- (1/0). The host's at:<host> (and err:<host>); the status follows from every host's:
-- ready once a host has it, failed once every host failed (the lead's error first), else
-- building; left alone while a delete runs (deleting). 1, or 0 (not that job's).
--#include tpl_status
local v = redis.call('HMGET', KEYS[1], 'job', 'status', 'error')
if v[1] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'at:' .. ARGV[2], ARGV[3], 'updated', ARGV[6])
if ARGV[3] == 'failed' then
  redis.call('HSET', KEYS[1], 'err:' .. ARGV[2], ARGV[4])
  if ARGV[7] == '1' or not v[3] then
    redis.call('HSET', KEYS[1], 'error', ARGV[4], 'failed_step', ARGV[5])
  end
end
if v[2] == 'deleting' then return 1 end
tpl_status(KEYS[1])
return 1
