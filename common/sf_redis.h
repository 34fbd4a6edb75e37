/* sf_redis: hiredis async on libevent with automatic reconnect, and Lua scripts called by
 * SHA. Generic: the key layout and the scripts themselves are the state module's
 * (state/sf_store.h). */
#ifndef SF_REDIS_H
#define SF_REDIS_H

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stddef.h>

#include "sf_msg.h"

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
/* What a caller whose write was refused that way is told: SF_MSG_PLATFORM_FULL (sf_msg.h). */

/* A Lua script called by SHA (EVALSHA) with its keys declared, so it runs on Redis
 * Cluster when its keys share one hash slot. Its SHA1 is computed here once; a Redis that
 * does not have it (NOSCRIPT: first use, a restart, SCRIPT FLUSH) gets the source (EVAL),
 * which loads it for the next calls. Every script starts with a "#!lua" line: Redis then
 * refuses any access to a key of another hash slot, declared or not (on a cluster, and
 * the one-node cluster of ops/test proves it). Static, one per script; usable from any
 * thread. */
typedef struct sf_redis_script {
    const char *src;
    char sha[41];
    int ready; /* sha is set (atomic) */
} sf_redis_script;
#define SF_REDIS_SCRIPT(source) {(source), "", 0}
/* argv[0..nkeys) are the keys, the rest the arguments (binary-safe, lens; at most
 * SF_REDIS_SCRIPT_ARGS_MAX together, 64 for _sync). cb as for sf_redis_cmd. 0, -ENOTCONN,
 * -EINVAL or -ENOMEM (cb not called). */
#define SF_REDIS_SCRIPT_ARGS_MAX 2048
int sf_redis_script_call(sf_redis *r, sf_redis_script *s, redisCallbackFn *cb, void *priv,
                         int nkeys, int nargs, const char **argv, const size_t *lens);
/* The same on a blocking connection: the reply (the caller frees it), or NULL when the
 * connection broke. lens NULL: strlen of each. */
redisReply *sf_redis_script_sync(redisContext *c, sf_redis_script *s, int nkeys, int nargs,
                                 const char **argv, const size_t *lens);
/* The script's SHA1 (40 hex digits). */
const char *sf_redis_script_sha(sf_redis_script *s);

/* Blocking connection for tools (CLI, tests). NULL with why. */
redisContext *sf_redis_connect_sync(const char *url, char *why, size_t whylen);

#endif
