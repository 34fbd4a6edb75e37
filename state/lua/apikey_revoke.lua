#!lua flags=allow-oom
-- apikey_revoke
--
-- KEYS: the id index (sf:apikeys:{apikeys}), the key's record, its producer credential (the
-- pid the caller read from the record; any key of the slot when it had none). ARGV: id,
-- hash, pid ('' for none), the gateways' channel, the message ('key:<hash>'). The key goes
-- at once and whole: its record, its credential, its id in the index, and every gateway is
-- told (it drops the key from its cache). Answers 'ok', 'gone' (no key with that id) or
-- 'again' (the index or the record changed since the caller read them: read them again).
local hash = redis.call('HGET', KEYS[1], ARGV[1])
if not hash then return 'gone' end
if hash ~= ARGV[2] or (redis.call('HGET', KEYS[2], 'pid') or '') ~= ARGV[3] then
  return 'again'
end
if ARGV[3] ~= '' then redis.call('DEL', KEYS[3]) end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 'ok'
