#!lua
-- place_record
--
-- Placement's last step: the record. ARGV: id, team, host, name, template, metadata, now,
-- timeout_s, memory MiB, vCPU milli. A record of the team that is live answers
-- {'ok', its host} (the same create, redelivered); another {'conflict'}; a new one is
-- written `creating`: {'ok', host}.
--#include dead
local old = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')
if old[1] then
  if old[1] == ARGV[2] and not dead(old[3]) then return {'ok', old[2] or ''} end
  return {'conflict'}
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'team', ARGV[2], 'host', ARGV[3], 'state', 'creating', 'name', ARGV[4], 'template', ARGV[5], 'metadata', ARGV[6], 'created', ARGV[7], 'last_active', ARGV[7], 'timeout_seconds', ARGV[8], 'res_mem_mib', ARGV[9], 'res_vcpu_milli', ARGV[10])
return {'ok', ARGV[3]}
