-- KEYS: the host's timers. ARGV: (op, member, score) triples: 'a' add, 'x' move one that
-- is there (ZADD XX), 'r' remove. Answers how many members changed.
local n = 0
for i = 1, #ARGV, 3 do
  local o, m, s = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if o == 'r' then n = n + redis.call('ZREM', KEYS[1], m)
  elseif o == 'x' then n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', s, m)
  else n = n + redis.call('ZADD', KEYS[1], 'CH', s, m) end
end
return n
