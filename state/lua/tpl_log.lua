#!lua
-- tpl_log
--
-- KEYS: a team template, its log. ARGV: job, text, max bytes. Appended while the log stays
-- within max bytes: its length, or 0.
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end
if redis.call('STRLEN', KEYS[2]) + #ARGV[2] > tonumber(ARGV[3]) then return 0 end
return redis.call('APPEND', KEYS[2], ARGV[2])
