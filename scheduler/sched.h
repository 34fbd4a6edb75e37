/* The scheduler: consumes sf.jobs, answers control-plane tools from Redis, places
 * sandbox_create on a live host and routes every other call to the owning host. */
#ifndef SCH_SCHED_H
#define SCH_SCHED_H

#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_jobio.h"
#include "sf_redis.h"
#include "sf_tools.h"

typedef struct sch_cfg {
    sf_common_cfg common;
    int64_t host_ttl_ms;        /* a host is live while its heartbeat is younger than this */
    int64_t host_dead_ms;       /* ...and removed, its sandboxes lost, after this long */
    int64_t team_sandbox_limit; /* sandboxes per team */
    int64_t team_host_share_pct;  /* a team holds at most this share of one host... */
    int64_t team_fleet_share_pct; /* ...and of all live hosts together */
    int64_t sandbox_memory_mib;   /* the shape of a new sandbox (args.limits) */
    int64_t sandbox_vcpu_milli;
    int64_t sandbox_disk_mib;     /* 0: the worker's default */
    int64_t sandbox_inodes;       /* 0: the worker's default */
    int64_t sandbox_pids_max;
    char *schemas_dir;          /* tool schemas: arguments are checked here too */
    char *auth_secret_file;     /* the deployment's auth secret: signed jobs (auth.c) */
    int64_t accept_unsigned;    /* 1: jobs without a signature are taken as a gateway's */
    int64_t template_wait_s;    /* a create waits this long for a template being built */
    char *default_template;     /* sandbox_create without from_template: debian or base */
} sch_cfg;

typedef struct sch_ctx {
    sf_daemon d;
    sch_cfg cfg;
    sf_redis *redis;
    rd_kafka_t *producer, *consumer;
    sf_jobq *jobq;
    sf_toolset tools;
    struct event *ev_reap;
    uint8_t auth_secret[32];    /* unseals producer credentials */
    uint8_t gateway_key[32];    /* the gateways' job credential */
} sch_ctx;

/* One job being handled; freed by sch_call_done. */
typedef struct sch_call {
    sch_ctx *ctx;
    sf_job job;
    sf_kafka_ticket ticket;
    int silent;             /* an internal message (sf.cancel): no reply, ever */
    char pin[SF_ID_MAX];    /* sandbox_create from a snapshot: the host that holds it */
} sch_call;

/* route.c */
/* 0 when every tool declared to run in the scheduler has a handler here (and back). */
int sch_route_check(const sf_toolset *tools, char *why, size_t whylen);
void sch_on_job(void *arg, sf_job *job, sf_kafka_ticket tk);
void sch_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why);
void sch_reply_error(sch_call *c, const char *code, const char *message);
void sch_reply_result(sch_call *c, json_t *result); /* steals result */
void sch_forward(sch_call *c, const char *host);
void sch_call_done(sch_call *c);

#define SCH_MSG_REDIS_DOWN "The platform's state store is unreachable; retry in a few seconds."

/* auth.c: every job's producer signature is checked before it is routed (a producer's
 * team comes from its key); a job that fails is answered `unauthenticated` and
 * dead-lettered. sch_route_job goes on with a job that passed. */
int sch_auth_init(sch_ctx *ctx, char *why, size_t whylen);
void sch_auth_job(sch_call *c);
/* Kafka headers signing p (a job for host `host`) as the scheduler with that host's key
 * (sf_host_job_key), now; NULL when out of memory. */
rd_kafka_headers_t *sch_host_headers(sch_ctx *ctx, const char *host, const void *p, size_t n);
/* Produces p to host's topic (sf.host.<host>), signed; 0 or -errno. */
int sch_host_produce(sch_ctx *ctx, const char *host, const char *key, const void *p, size_t n);
void sch_route_job(sch_call *c);

/* hosts.c: the live hosts as placement sees them, read one host per call: cb gets a JSON
 * array (borrowed) of {h, cap, running, used (the most of running and reserved), mem,
 * vcpu (absent until the worker publishes them), rmem, rvcpu (reserved), deb (has
 * 'debian'), debb (is building it), driver}, or NULL when Redis did not answer. 0, or -errno (cb not called). */
typedef void (*sch_hosts_cb)(void *priv, json_t *hosts);
int sch_hosts_read(sch_ctx *ctx, sch_hosts_cb cb, void *priv);

/* place.c: sandbox_create (limits, fair share, host choice, reservation); finishes the
 * call. */
void sch_place_create(sch_call *c);

/* store.c: Redis-backed tools; each finishes the call. */
void sch_store_list(sch_call *c);
void sch_store_info(sch_call *c);

/* egress.c: answered from Redis, no sandbox touched (a paused one stays paused) */
void sch_egress_secret_list(sch_call *c);   /* the team's secrets: metadata, never values */
void sch_egress_network_log(sch_call *c);   /* the sandbox's network log (limit, verdict) */

void sch_store_route(sch_call *c);

/* snapshots.c: the team's snapshots (list, delete), and sandbox_create's from_snapshot:
 * finds it, then places the create on its host with its shape (sch_place_create). */
void sch_snap_list(sch_call *c);
void sch_snap_delete(sch_call *c);
void sch_snap_place(sch_call *c);

/* templates.c: the team's templates (list) and their builds (create, handed to a host) */
void sch_tpl_list(sch_call *c);
void sch_tpl_create(sch_call *c);
void sch_tpl_delete(sch_call *c);
int sch_store_start_reaper(sch_ctx *ctx);
/* tpl_join.c: each live jail host gets the ready team templates another live host holds
 * (one pass at a time; run by the reaper's tick). */
void sch_tpl_join(sch_ctx *ctx);
void sch_tpl_join_fini(void); /* at exit, once Redis's callbacks ran */

#endif
