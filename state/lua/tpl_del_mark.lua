#!lua flags=allow-oom
-- tpl_del_mark
--
-- KEYS: a team template. ARGV: the delete's job. Marks it `deleting` (no new sandbox or
-- build uses it from now on), its status before kept in `before`. 'none' or 'ok'.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'none' end
if st ~= 'deleting' then
  redis.call('HSET', KEYS[1], 'status', 'deleting', 'before', st, 'deljob', ARGV[1])
end
return 'ok'
