/* sf_redis: hiredis async on libevent with automatic reconnect, plus the Redis
 * key layout (schemas/redis-keys.md). Every key carries a {hash tag}. */
#ifndef SF_REDIS_H
#define SF_REDIS_H

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stddef.h>

typedef struct sf_redis sf_redis;

/* url: redis://HOST:PORT or unix:/PATH. Connects in the background and
 * reconnects every 500 ms while down. NULL with why on a bad URL. */
sf_redis *sf_redis_new(struct event_base *base, const char *url, char *why, size_t whylen);
void sf_redis_free(sf_redis *r);
int sf_redis_connected(const sf_redis *r);
/* fn(arg) runs each time the connection is (re)established (e.g. to SUBSCRIBE again). */
void sf_redis_on_connect(sf_redis *r, void (*fn)(void *arg), void *arg);
/* Sends one command. cb(ctx, reply, priv) runs once; reply is NULL if the
 * connection dropped before the answer. -ENOTCONN when down (cb not called). */
int sf_redis_cmd(sf_redis *r, redisCallbackFn *cb, void *priv, const char *fmt, ...);
int sf_redis_cmdargv(sf_redis *r, redisCallbackFn *cb, void *priv, int argc, const char **argv,
                     const size_t *argvlen);

/* Redis runs with maxmemory and noeviction: when it is full it refuses writes that would
 * grow it with an "OOM ..." error (also from inside scripts). True for such a reply. */
int sf_redis_is_oom(const redisReply *rep);
/* What a caller whose write was refused that way is told. */
#define SF_MSG_PLATFORM_FULL                                                                   \
    "The platform is full (its state store reached its memory limit); kill sandboxes you "    \
    "no longer need and retry, or ask the operator to raise the Redis maxmemory."

/* A Lua script called by SHA (EVALSHA) with its keys declared, so it runs on Redis
 * Cluster when its keys share one hash slot. The first call sends the source (EVAL) and
 * learns the SHA (SCRIPT LOAD); a Redis that lost its scripts (NOSCRIPT) gets the source
 * again. One per script, static, used from one thread (event loop). */
typedef struct sf_redis_script {
    const char *src;
    char sha[41];
    int loading;
} sf_redis_script;
#define SF_REDIS_SCRIPT(source) {(source), "", 0}
/* argv[0..nkeys) are the keys, the rest the arguments (binary-safe, lens). cb as for
 * sf_redis_cmd. 0, -ENOTCONN, -EINVAL or -ENOMEM (cb not called). */
int sf_redis_script_call(sf_redis *r, sf_redis_script *s, redisCallbackFn *cb, void *priv,
                         int nkeys, int nargs, const char **argv, const size_t *lens);

/* Blocking connection for tools (CLI, tests). NULL with why. */
redisContext *sf_redis_connect_sync(const char *url, char *why, size_t whylen);

/* Key layout. */
#define SF_RK_APIKEY "sf:apikey:{%s}"     /* hash-hex -> hash {id, team, created} */
#define SF_RK_APIKEY_IDS "sf:apikeys"     /* hash: key id -> hash-hex */
#define SF_RK_SANDBOX "sf:sb:{%s}"        /* sandbox id -> hash (record) */
#define SF_RK_TEAM_SANDBOXES "sf:team:{%s}:sandboxes" /* set of sandbox ids */
#define SF_RK_TEAM_RETIRED "sf:team:{%s}:retired" /* zset: retired sandbox id -> ms */
#define SF_RK_TEAM_RES "sf:team:{%s}:res"   /* hash: what placement reserved for the team */
#define SF_RK_TEAM_LIMITS "sf:team:{%s}:limits" /* hash: the operator's per-team limits */
#define SF_RK_HOST_SANDBOXES "sf:host:{%s}:sandboxes" /* set of sandbox ids placed there */
#define SF_RK_HOSTS "sf:hosts"            /* zset host id -> last heartbeat ms */
#define SF_RK_HOST "sf:host:{%s}"         /* hash {topic, capacity, running, driver, ts} */
#define SF_RK_JOB "sf:job:{%s}"           /* job guard: running where / done + reply */
#define SF_RK_IDEM "sf:idem:{%s}:%s"      /* team, key hash -> an idempotent call's answer */
#define SF_RK_SESSION "sf:mcpsess:{%s}"   /* MCP session -> hash {team, protocol} */
#define SF_RK_TEAM_SESSIONS "sf:team:{%s}:sessions" /* zset session id -> last use ms */
/* Pub/sub channel every gateway listens on: "key:<hash>" (an API key was revoked),
 * "sess:<id>" (an MCP session was deleted). */
#define SF_CH_GATEWAY "sf:gw:events"

#endif
