/* sf_redis: hiredis async on libevent with automatic reconnect, Redis Cluster spoken
 * natively, and Lua scripts called by SHA. Generic: the key layout and the scripts
 * themselves are the state module's (state/sf_store.h).
 *
 * Cluster: the first seed that answers is asked CLUSTER SLOTS; a plain Redis (cluster
 * support disabled) gets every command. On a cluster each command and script goes to the
 * master of its keys' hash slot (they share one: the state module's rule), MOVED and ASK
 * are followed (MOVED also has the map asked again), and a lost node has the map asked
 * again every 100 ms until its slots have a master that answers (a failover). Commands
 * without keys (PUBLISH, SUBSCRIBE, PING) go to any connected node: a node's Pub/Sub is
 * the whole cluster's. A command for a slot whose master is down fails at once
 * (-ENOTCONN), as with a plain Redis that is down; one already sent when its node died
 * gets a NULL reply (never sent again: it may have run). */
#ifndef SF_REDIS_H
#define SF_REDIS_H

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stddef.h>

#include "sf_msg.h"

typedef struct sf_redis sf_redis;

/* url: redis://HOST:PORT, unix:/PATH, or several seeds of one cluster,
 * redis://HOST:PORT,HOST:PORT,... Connects in the background and reconnects every 500 ms
 * while down. NULL with why on a bad URL. */
sf_redis *sf_redis_new(struct event_base *base, const char *url, char *why, size_t whylen);
void sf_redis_free(sf_redis *r);
int sf_redis_connected(const sf_redis *r);
/* True once the first node answered that it is part of a cluster. */
int sf_redis_is_cluster(const sf_redis *r);
/* fn(arg) runs each time the connection is (re)established (e.g. to SUBSCRIBE again); on a
 * cluster, each time keyless commands move to another node (the one in use was lost). */
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

/* Blocking connection for tools (CLI, tests, a worker's start), to the first seed that
 * answers. NULL with why. On a cluster, send through sf_redis_sync_cmd / _argv (and
 * sf_redis_script_sync): they route by slot and follow MOVED/ASK; free it with
 * sf_redis_sync_free, which also closes the other masters' connections. */
redisContext *sf_redis_connect_sync(const char *url, char *why, size_t whylen);
void sf_redis_sync_free(redisContext *c);
/* redisCommand / redisCommandArgv, routed on a cluster. NULL when the connection broke. */
redisReply *sf_redis_sync_cmd(redisContext *c, const char *fmt, ...);
redisReply *sf_redis_sync_vcmd(redisContext *c, const char *fmt, va_list ap);
redisReply *sf_redis_sync_argv(redisContext *c, int argc, const char **argv,
                               const size_t *lens);
/* The connections of every master (on a plain Redis: c itself), for commands that each
 * node answers for its own keys only (SCAN). Their count, -ENOSPC beyond max, or
 * -ENOTCONN when a master cannot be reached. They stay c's (sf_redis_sync_free). */
int sf_redis_sync_masters(redisContext *c, redisContext **out, int max);

/* Redis Cluster's hash slot of a key (CRC16 of it, or of its {hash tag}). */
#define SF_REDIS_SLOTS 16384
int sf_redis_slot(const char *key, size_t n);

#endif
