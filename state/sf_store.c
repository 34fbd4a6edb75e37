/* sf_store: the store's Lua scripts, each one a file in lua/ (its KEYS, ARGV and answers
 * are said at its top), embedded at build time by lua/embed.cmake (sf_lua.h is generated)
 * and called by SHA (sf_redis_script). The key layout: sf_store.h. */
#include "sf_store.h"
#include "sf_lua.h"

#define S(name) sf_redis_script sf_store_##name = SF_REDIS_SCRIPT(sf_lua_##name)

/* ==== a sandbox's record: KEYS[1] = sf:sb:{<id>} ==================================== */
S(rec_retire);
S(rec_killing);
S(rec_started);
S(rec_touch);
S(rec_set);
S(rec_unset);
S(rec_drop_dead);
S(place_record);

/* ==== a team: sf:team:{<team>}:* ===================================================== */
S(team_release);
S(place_team);

/* ==== a host: sf:host:{<host>}* ====================================================== */
S(host_release);
S(host_view);
S(place_host);
S(host_beat);
S(hosts_beat);
S(hosts_drop);

/* ==== lifecycle timers: the record (KEYS[1]), then the host's timers ================= */
S(tm_start);
S(tm_paused);
S(tm_resumed);
S(tm_update);
S(timers_set);
S(timers_grow);
S(timers_due);

/* ==== claim checks: KEYS = the team's claims (zset), their sizes (hash), the claim ==== */
S(claim_put);
S(claim_take);

/* ==== secrets: KEYS[1] sf:team:{t}:secret:<name>, KEYS[2] sf:team:{t}:secrets ========= */
S(secret_create);
S(secret_rotate);
S(secret_delete);

/* ==== API keys: the slot {apikeys} (sf_apikeys.c) ====================================== */
S(apikey_create);
S(apikey_revoke);

/* ==== MCP sessions ==================================================================== */
S(sess_put);
S(sess_team);

/* ==== team templates: sf:team:{<team>}:tpl:* ========================================= */
S(tpl_create);
S(tpl_row);
S(tpl_set);
S(tpl_log);
S(tpl_done);
S(tpl_join);
S(tpl_host_lost);
S(tpl_del_mark);
S(tpl_del_undo);
S(tpl_del);

/* ==== a team's snapshots: sf:team:{<team>}:snaps, :snap:<name> (lib/snaps.lua) ======= */
S(snap_reserve);
S(snap_finish);
S(snap_find);
S(snap_list);
S(snap_delete);
S(snap_drop);
S(snap_check);

/* ==== the job guard: KEYS[1] = sf:job:{<team>}:<id>, KEYS[2] sf:team:{<team>}:gk, KEYS[3]
 * sf:team:{<team>}:gkb (worker/jobs.c): one slot, the team's ============================ */
S(guard_begin);
S(guard_done);

/* ==== unauthenticated writes: KEYS[1] sf:oauth:{kind}:addr:<a>, KEYS[2] its live zset === */
S(oauth_admit);
S(oauth_used);

/* Every script above, for the store's tests (NULL-terminated). */
sf_redis_script *const sf_store_all[] = {
    &sf_store_rec_retire,
    &sf_store_rec_killing,
    &sf_store_rec_started,
    &sf_store_rec_touch,
    &sf_store_rec_set,
    &sf_store_rec_unset,
    &sf_store_rec_drop_dead,
    &sf_store_place_record,
    &sf_store_team_release,
    &sf_store_place_team,
    &sf_store_host_release,
    &sf_store_host_view,
    &sf_store_place_host,
    &sf_store_host_beat,
    &sf_store_hosts_drop,
    &sf_store_hosts_beat,
    &sf_store_tm_start,
    &sf_store_tm_paused,
    &sf_store_tm_resumed,
    &sf_store_tm_update,
    &sf_store_timers_set,
    &sf_store_timers_grow,
    &sf_store_timers_due,
    &sf_store_claim_put,
    &sf_store_claim_take,
    &sf_store_secret_create,
    &sf_store_secret_rotate,
    &sf_store_secret_delete,
    &sf_store_apikey_create,
    &sf_store_apikey_revoke,
    &sf_store_sess_put,
    &sf_store_sess_team,
    &sf_store_tpl_create,
    &sf_store_tpl_row,
    &sf_store_tpl_set,
    &sf_store_tpl_log,
    &sf_store_tpl_done,
    &sf_store_tpl_host_lost,
    &sf_store_tpl_join,
    &sf_store_tpl_del_mark,
    &sf_store_tpl_del_undo,
    &sf_store_tpl_del,
    &sf_store_snap_reserve,
    &sf_store_snap_finish,
    &sf_store_snap_find,
    &sf_store_snap_list,
    &sf_store_snap_delete,
    &sf_store_snap_drop,
    &sf_store_snap_check,
    &sf_store_guard_begin,
    &sf_store_guard_done,
    &sf_store_oauth_admit,
    &sf_store_oauth_used,
    NULL,
};
