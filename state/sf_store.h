/* sf_store: every Redis key name and every Lua script sandfleet runs in Redis, in one place
 * (schemas/redis-keys.md is the map of the keys; each script is a file in lua/, embedded at
 * build time: docs/internals/state.md). Each is called by SHA (sf_redis_script_call / _sync), declares
 * every key it touches in KEYS, and all of one call's keys share one {hash tag}: one hash
 * slot, so the same code runs on Redis Cluster. Where a change spans slots (a sandbox's
 * record, its team's and its host's keys), it is several single-slot steps, each one
 * idempotent (keyed by the sandbox id), in an order where a step that did not happen is
 * either healed by repeating the operation or harmless (sf_records.h says which).
 *
 * Each script's file says its KEYS and ARGV and what it answers at its top. The scripts that
 * must land when Redis is at its maxmemory (they overwrite or free) carry allow-oom. */
#ifndef SF_STORE_H
#define SF_STORE_H

#include "sf_redis.h"

/* ==== the key layout (schemas/redis-keys.md is its map) ==== */
/* API keys (sf_apikeys.h): the record, the id index and each key's producer credential
 * share the slot {apikeys}, so a create and a revoke are one script each. */
#define SF_RK_APIKEY "sf:apikey:{apikeys}:%s" /* hash-hex -> hash {id, team, name, created, pid} */
#define SF_RK_APIKEY_IDS "sf:apikeys:{apikeys}" /* hash: key id -> hash-hex */
#define SF_RK_SANDBOX "sf:sb:{%s}"        /* sandbox id -> hash (record) */
#define SF_RK_TEAM_SANDBOXES "sf:team:{%s}:sandboxes" /* set of sandbox ids */
#define SF_RK_TEAM_RETIRED "sf:team:{%s}:retired" /* zset: retired sandbox id -> ms */
#define SF_RK_TEAM_RES "sf:team:{%s}:res"   /* hash: what placement reserved for the team */
#define SF_RK_TEAM_LIMITS "sf:team:{%s}:limits" /* hash: the operator's per-team limits */
#define SF_RK_HOST_SANDBOXES "sf:host:{%s}:sandboxes" /* set of sandbox ids placed there */
#define SF_RK_HOSTS "sf:hosts"            /* zset host id -> last heartbeat ms */
#define SF_RK_HOST "sf:host:{%s}"         /* hash {topic, capacity, running, driver, ts} */
#define SF_RK_HOST_DRAIN "sf:host:{%s}:drain" /* string (ms): `sandfleet hosts drain`; the
                                                 worker empties itself; its next start clears it */
#define SF_RK_JOB "sf:job:{%s}:%s"        /* team, job id -> guard: running where / done + reply */
#define SF_RK_TEAM_GUARDS "sf:team:{%s}:gk" /* zset "<job id>:<bytes>" -> expiry ms: kept replies */
#define SF_RK_TEAM_GUARD_BYTES "sf:team:{%s}:gkb" /* their bytes (a counter) */
#define SF_RK_IDEM "sf:idem:{%s}:%s"      /* team, key hash -> an idempotent call's answer */
#define SF_RK_SESSION "sf:mcpsess:{%s}"   /* MCP session -> hash {team, protocol} */
#define SF_RK_TEAM_SESSIONS "sf:team:{%s}:sessions" /* zset session id -> last use ms */
/* Pub/sub channel every gateway listens on: "key:<hash>" (an API key was revoked),
 * "sess:<id>" (an MCP session was deleted). */
#define SF_CH_GATEWAY "sf:gw:events"
#define SF_RK_HOST_RES "sf:host:{%s}:res" /* hash: sandbox id -> "<mem MiB> <vCPU milli>" */
/* sf_oauth.h */
#define SF_RK_OAUTH_CLIENT "sf:oauth:client:{%s}"   /* client id -> registration */
#define SF_RK_OAUTH_REQ "sf:oauth:req:{%s}"         /* CSRF hash -> authorization request */
#define SF_RK_OAUTH_CODE "sf:oauth:code:{%s}"       /* code hash -> what it grants (single use) */
#define SF_RK_OAUTH_USEDCODE "sf:oauth:usedcode:{%s}" /* code hash -> grant id (reuse = attack) */
#define SF_RK_OAUTH_AT "sf:oauth:at:{%s}"           /* access token hash -> grant */
#define SF_RK_OAUTH_RT "sf:oauth:rt:{%s}"           /* refresh token hash -> grant */
#define SF_RK_OAUTH_RTOLD "sf:oauth:rtold:{%s}"     /* rotated refresh token hash -> grant id */
#define SF_RK_OAUTH_GRANT "sf:oauth:grant:{%s}"     /* grant id -> hash {team, client, ...} */
/* What unauthenticated clients may write, bounded (gateway/oauth.c, script oauth_admit):
 * a per-address counter (a minute's window) and a zset of the live entries by expiry, one
 * slot per kind: registrations not yet used, sign-in pages. */
#define SF_RK_OAUTH_REG_ADDR "sf:oauth:{reg}:addr:%s"   /* address -> registrations this minute */
#define SF_RK_OAUTH_REG_UNUSED "sf:oauth:{reg}:unused"  /* zset client id -> expiry ms */
#define SF_RK_OAUTH_PAGE_ADDR "sf:oauth:{page}:addr:%s" /* address -> sign-in pages this minute */
#define SF_RK_OAUTH_PAGES "sf:oauth:{page}:live"        /* zset CSRF hash -> expiry ms */
/* sf_netlog.h */
#define SF_RK_NETLOG "sf:sb:{%s}:netlog"  /* stream, capped */
/* sf_templates.h */
#define SF_RK_TEMPLATE "sf:team:{%s}:tpl:%s"          /* hash: one team template */
#define SF_RK_TEMPLATE_LOG "sf:team:{%s}:tpl:%s:log"  /* string: its build log */
#define SF_RK_TEAM_TEMPLATES "sf:team:{%s}:tpls"      /* set of the team's template names */
#define SF_RK_HOST_TEMPLATES "sf:host:{%s}:tpls" /* set "<team> <name>": templates built there */
/* sf_snapshots.h */
#define SF_RK_SNAPSHOT "sf:team:{%s}:snap:%s"      /* hash: one snapshot, by name */
#define SF_RK_TEAM_SNAPSHOTS "sf:team:{%s}:snaps" /* set of the team's snapshot names */
/* sf_secrets.h */
#define SF_RK_SECRET "sf:team:{%s}:secret:%s" /* hash: one secret */
#define SF_RK_TEAM_SECRETS "sf:team:{%s}:secrets" /* set of the team's secret names */
#define SF_RK_SECRETS_TEAMS "sf:secrets:teams"    /* set of teams that hold secrets (admin list) */
/* sf_timers.h */
#define SF_RK_HOST_TIMERS "sf:host:{%s}:timers" /* zset "<kind>:<id>" -> fire time (ms) */
/* sf_claim.c */
#define SF_RK_TEAM_CLAIMS "sf:team:{%s}:cc"       /* zset: claim key -> expiry (ms) */
#define SF_RK_TEAM_CLAIM_BYTES "sf:team:{%s}:ccb" /* hash: claim key -> bytes */
/* sf_jobauth.h: a key's producer credential, hash {team, key, psk (sealed)}, in the API
 * keys' slot (sf_apikeys.h, written and deleted with the key); a signed job
 * already taken: its MAC's first 16 bytes (hex) -> "partition:offset" */
#define SF_RK_PRODUCER "sf:pkey:{apikeys}:%s"
#define SF_RK_PRODUCER_SEEN "sf:pkey:{%s}:seen:%s"
/* claim checks (sf_claim.h): sf:cc:{<team>}:<job>:a:<arg> / ...:r:<field> */
#define SF_RK_CLAIM "sf:cc:{%s}:%s:%c:%s"

/* ---- a sandbox's record, sf:sb:{<id>} (state/sf_records.c) ---- */
extern sf_redis_script sf_store_rec_retire;    /* K rec. A now ttl state only_live */
extern sf_redis_script sf_store_rec_killing;   /* K rec */
extern sf_redis_script sf_store_rec_started;   /* K rec. A host field value... */
extern sf_redis_script sf_store_rec_touch;     /* K rec. A now */
extern sf_redis_script sf_store_rec_set;       /* K rec. A field value... */
extern sf_redis_script sf_store_rec_unset;     /* K rec. A field... */
extern sf_redis_script sf_store_rec_drop_dead; /* K rec */
/* ---- a team's sandboxes, sf:team:{<team>}:* ---- */
extern sf_redis_script sf_store_team_release; /* K sandboxes res retired. A id now ttl keep tomb */
extern sf_redis_script sf_store_place_team;   /* K limits sandboxes res template. A see .c */
/* ---- a host, sf:host:{<host>}* ---- */
extern sf_redis_script sf_store_host_release; /* K res sandboxes timers. A id */
extern sf_redis_script sf_store_host_view;    /* K host res */
extern sf_redis_script sf_store_place_host;   /* K host res sandboxes. A id mem vcpu now ttl */
extern sf_redis_script sf_store_host_beat;    /* K host. A expire_ms field value... */
extern sf_redis_script sf_store_hosts_drop;   /* K sf:hosts. A host cutoff */
extern sf_redis_script sf_store_hosts_beat;   /* K sf:hosts. A host now */
extern sf_redis_script sf_store_place_record; /* K rec. A see .c */
/* ---- lifecycle timers (state/sf_timers.c) ---- */
extern sf_redis_script sf_store_tm_start;   /* K rec. A now timeout_at lifetime_at idle ad */
extern sf_redis_script sf_store_tm_paused;  /* K rec. A now */
extern sf_redis_script sf_store_tm_resumed; /* K rec */
extern sf_redis_script sf_store_tm_update;  /* K rec. A id team now setmd md timeout ad */
extern sf_redis_script sf_store_timers_set;  /* K timers. A (op member score)... */
extern sf_redis_script sf_store_timers_grow; /* the same, refused when Redis is full */
extern sf_redis_script sf_store_timers_due; /* K timers. A now max */
/* ---- claim checks (state/sf_claim.c) ---- */
extern sf_redis_script sf_store_claim_put;  /* K team claims, sizes, claim. A data now ttl budget */
extern sf_redis_script sf_store_claim_take; /* K as put */
/* ---- secrets (state/sf_secrets.c) ---- */
extern sf_redis_script sf_store_secret_create; /* K secret, team's names. A see .c */
extern sf_redis_script sf_store_secret_rotate;  /* K secret. A sealed now hosts */
extern sf_redis_script sf_store_secret_delete;  /* K secret, team's names. A name */
/* ---- API keys (state/sf_apikeys.c) ---- */
extern sf_redis_script sf_store_apikey_create; /* K record ids pkey. A id team name created pid psk hash */
extern sf_redis_script sf_store_apikey_revoke; /* K ids record pkey. A id hash pid channel message */
/* ---- MCP sessions (gateway/auth.c) ---- */
extern sf_redis_script sf_store_sess_put;  /* K session. A team protocol now ttl */
extern sf_redis_script sf_store_sess_team; /* K team's sessions. A sid now ttl limit */
/* ---- team templates (scheduler/templates.c) ---- */
extern sf_redis_script sf_store_tpl_create; /* K tpl log tpls from. A see .c */
extern sf_redis_script sf_store_tpl_row;    /* K tpl */
extern sf_redis_script sf_store_tpl_set;  /* K tpl. A job field value now (worker/tpl_build.c) */
extern sf_redis_script sf_store_tpl_log;  /* K tpl log. A job text max */
extern sf_redis_script sf_store_tpl_done; /* K tpl. A job host ready|failed error step now lead */
extern sf_redis_script sf_store_tpl_host_lost; /* K tpl [team res]. A host why now [name] */
extern sf_redis_script sf_store_tpl_join; /* K tpl from. A host deb from (scheduler/tpl_join.c) */
extern sf_redis_script sf_store_tpl_del_mark; /* K tpl. A job */
extern sf_redis_script sf_store_tpl_del_undo; /* K tpl. A job */
extern sf_redis_script sf_store_tpl_del;      /* K tpl log tpls. A name */
/* ---- a team's snapshots (state/sf_snapshots.c): KEYS :snaps, [own record,] every
 * member's record; {'again'} when a member was not declared (read the set again) ---- */
extern sf_redis_script sf_store_snap_reserve; /* K snaps rec members. A max_n max_bytes kv... */
extern sf_redis_script sf_store_snap_finish;  /* K snaps rec members. A id size max now */
extern sf_redis_script sf_store_snap_find;    /* K snaps members. A ref */
extern sf_redis_script sf_store_snap_list;    /* K snaps members */
extern sf_redis_script sf_store_snap_delete;  /* K snaps members. A ref */
extern sf_redis_script sf_store_snap_drop;    /* K rec snaps. A id name */
extern sf_redis_script sf_store_snap_check;   /* K rec snaps. A id name stale_taking */

/* ---- the job guard (worker/jobs.c) ---- */
extern sf_redis_script sf_store_guard_begin; /* K job gk gkb. A host inst ttl topic now budget force */
extern sf_redis_script sf_store_guard_done;  /* K job gk gkb. A reply ttl now budget id */
/* ---- unauthenticated writes (gateway/oauth.c): KEYS addr counter, live zset ---- */
extern sf_redis_script sf_store_oauth_admit;  /* K addr live. A per_min max now ttl_ms member */
extern sf_redis_script sf_store_oauth_used;   /* K live. A member (a registration was used) */

/* Every script above (NULL-terminated): the store's tests check them all. */
extern sf_redis_script *const sf_store_all[];

#endif
