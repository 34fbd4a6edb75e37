-- A template's status from every host's at:<host>: ready once a host has it, failed once
-- every host failed, else building.
local function tpl_status(k)
  local ready, failed, n = false, 0, 0
  local h = redis.call('HGETALL', k)
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 3) == 'at:' then
      n = n + 1
      if h[i + 1] == 'ready' then ready = true end
      if h[i + 1] == 'failed' then failed = failed + 1 end
    end
  end
  local st = 'building'
  if ready then st = 'ready' elseif failed == n then st = 'failed' end
  redis.call('HSET', k, 'status', st)
  return st
end
