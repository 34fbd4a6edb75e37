#!lua
-- apikey_create
--
-- KEYS: the key's record (sf:apikey:{apikeys}:<hash>), the id index (sf:apikeys:{apikeys}),
-- the key's producer credential (sf:pkey:{apikeys}:<pid>). ARGV: id, team, name, created
-- (ms), pid, sealed credential, hash. A new team API key, all three or nothing: the record
-- (what gateways check), its id in the index (what `keys list` and `keys revoke` find) and
-- its credential on the job queue. Every check comes before the first write (a key of the
-- wrong type fails the call here, before anything is written; a full Redis refuses the
-- whole script). Answers 1 (created) or 0 (that hash or id exists: nothing written). A pid
-- of '' (a key moved from the layout before credentials, sf_apikeys_migrate) has no
-- credential: KEYS[3] is then not touched.
local cred = ARGV[5] ~= ''
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 or
   (cred and redis.call('EXISTS', KEYS[3]) == 1) then
  return 0
end
if cred then redis.call('HSET', KEYS[3], 'team', ARGV[2], 'key', ARGV[7], 'psk', ARGV[6]) end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'team', ARGV[2], 'name', ARGV[3], 'created', ARGV[4],
           'pid', ARGV[5])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[7])
return 1
