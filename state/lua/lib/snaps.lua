-- ==== a team's snapshots: sf:team:{<team>}:snaps, :snap:<name> (state/sf_snapshots.c) ===
-- The scripts that look at every snapshot of the team (its count, the bytes they hold,
-- one found by id) get every record declared: KEYS[1] is the team's :snaps, then records
-- (the call's own first, then one per member of :snaps as the caller read it). A member
-- whose record was not declared (the set changed since it was read) answers {'again'}:
-- the caller reads the set again. This part maps each declared record's name to its key (the
-- name from the key, never a key from a name), names = the members.
local pre = string.sub(KEYS[1], 1, #KEYS[1] - 5) .. 'snap:'
local rk = {}
for i = 2, #KEYS do
  if string.sub(KEYS[i], 1, #pre) == pre then rk[string.sub(KEYS[i], #pre + 1)] = KEYS[i] end
end
local names = redis.call('SMEMBERS', KEYS[1])
for _, n in ipairs(names) do if not rk[n] then return {'again'} end end
local function used(skip)
  local sum = 0
  for _, n in ipairs(names) do
    if n ~= skip then sum = sum + (tonumber(redis.call('HGET', rk[n], 'size')) or 0) end
  end
  return sum
end
local function find(ref)
  if rk[ref] and redis.call('SISMEMBER', KEYS[1], ref) == 1 then return ref end
  for _, n in ipairs(names) do
    if redis.call('HGET', rk[n], 'id') == ref then return n end
  end
  return nil
end
