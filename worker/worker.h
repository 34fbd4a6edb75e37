/* The worker: one per host. Consumes its host topic, runs each job against the
 * sandbox driver, answers on the caller's reply topic, heartbeats its capacity. */
#ifndef WK_WORKER_H
#define WK_WORKER_H

#include "sandbox.h"
#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_jobio.h"
#include "sf_map.h"
#include "sf_redis.h"

typedef struct wk_cfg {
    sf_common_cfg common;
    char *host_id;          /* "" = derived from the hostname */
    char *state_dir;
    char *agent_path;
    char *driver;           /* "jail" */
    int64_t capacity;       /* sandboxes this host runs at most */
    int64_t memory_mib;     /* per sandbox */
    int64_t pids_max;       /* per sandbox */
    int64_t heartbeat_ms;
    int64_t uid_base;
} wk_cfg;

typedef struct wk_ctx {
    sf_daemon d;
    wk_cfg cfg;
    char host_id[SF_ID_MAX];
    char topic[SF_TOPIC_MAX];
    wk_jail_opts jail;
    sf_redis *redis;
    rd_kafka_t *producer, *consumer;
    sf_jobq *jobq;
    sf_map *sandboxes;      /* id -> wk_box */
    struct event *ev_heartbeat;
    int stopping;             /* new jobs are refused */
} wk_ctx;

/* A sandbox this host runs, with what the worker keeps beside the driver's handle. */
typedef struct wk_box {
    wk_ctx *ctx;
    wk_sandbox *sb;
    char id[SF_ID_MAX];
    char team[SF_ID_MAX];
    json_t *env;            /* env_vars given at create (object of strings) */
    struct event *ev_timeout; /* sandbox lifetime (timeout_seconds) */
} wk_box;

/* jobs.c */
void wk_on_job(void *arg, sf_job *job, sf_kafka_ticket tk);
void wk_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why);
void wk_box_destroy(wk_box *b, const char *state);
void wk_redis_logged(redisAsyncContext *ac, void *r, void *priv);

/* host.c */
int wk_host_start(wk_ctx *ctx);
void wk_host_stop(wk_ctx *ctx);

#endif
