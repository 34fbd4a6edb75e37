#!lua
-- secret_create
--
-- ARGV: name, team, sealed value, hosts, header, format, now, version, the team's most,
-- any_header ('1'/'0'), allow_http ('1'/'0'). 1 created, 0 exists, -1 the team holds the
-- most.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[9]) then return -1 end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'team', ARGV[2], 'value', ARGV[3], 'hosts', ARGV[4], 'header', ARGV[5], 'format', ARGV[6], 'created', ARGV[7], 'updated', ARGV[7], 'version', ARGV[8], 'any_header', ARGV[10], 'allow_http', ARGV[11])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
