/* The scheduler: consumes sf.jobs, answers control-plane tools from Redis, places
 * sandbox_create on a live host and routes every other call to the owning host. */
#ifndef SCH_SCHED_H
#define SCH_SCHED_H

#include "sf_call.h"
#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_hostcaps.h"
#include "sf_jobio.h"
#include "sf_redis.h"
#include "sf_tools.h"
#include "sf_msg.h"

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
    int64_t desktop_memory_mib;   /* the shape of a 'desktop' sandbox */
    int64_t desktop_vcpu_milli;
    int64_t desktop_pids_max;
    char *schemas_dir;          /* tool schemas: arguments are checked here too */
    char *auth_secret_file;     /* the deployment's auth secret: signed jobs (auth.c) */
    int64_t accept_unsigned;    /* 1: jobs without a signature are taken as a gateway's */
    int64_t template_wait_s;    /* a create waits this long for a template being built */
    int64_t template_wait_detach_ms; /* ... at most this long when it asked for no progress */
    char *default_template;     /* sandbox_create without from_template: debian or base */
    char *preview_domain;       /* sandbox_info's preview URLs (common/sf_pvtoken.h) */
    char *preview_scheme;
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

/* One job being handled: created by the pipeline, finished by exactly one of call.c's
 * sch_call_error, sch_call_result, sch_call_forward or sch_call_done. */
typedef struct sch_call {
    sch_ctx *ctx;
    sf_job job;
    sf_call call;           /* its answer (once), deadline and offset (common/sf_call.h) */
    char pin[SF_ID_MAX];    /* sandbox_create from a snapshot: the host that holds it */
} sch_call;

#define SCH_MSG_REDIS_DOWN SF_MSG_STORE_DOWN
/* the reply topic of the template builds handed to hosts that joined (tpl_join.c): no one
 * reads it */
#define SCH_TOPIC_TPLJOIN SF_TOPIC_REPLY_PREFIX "tpljoin"

/* Who calls whom (docs/internals/scheduler.md): main -> pipeline -> auth, and the
 * handlers; handlers -> call, hosts, hostmsg; call -> hostmsg. Never back up. */

/* ---- call.c: finishing a call (below every handler) ---- */
/* A call for job (taken over) and its ticket; NULL when out of memory (the job is then
 * dropped and its offset moves on). */
sch_call *sch_call_new(sch_ctx *ctx, sf_job *job, sf_kafka_ticket tk);
/* Answer and end the call: an error (one actionable sentence), or a result (stolen). */
void sch_call_error(sch_call *c, const char *code, const char *message);
void sch_call_result(sch_call *c, json_t *result);
/* Reply then continue: answers the call now (result stolen) and keeps it open for the work
 * that goes on; the call then ends with sch_call_forward or sch_call_done, and its offset
 * moves once the answer and every forward are confirmed. */
void sch_call_result_then(sch_call *c, json_t *result);
/* Forwards the call to host's topic, signed for it, and ends it (its offset moves once
 * Kafka confirmed the forward); answers an error when it could not be sent. */
void sch_call_forward(sch_call *c, const char *host);
/* Ends the call without an answer (a silent one, or one answered already). */
void sch_call_done(sch_call *c);

/* ---- hostmsg.c: messages to a host's topic, signed with that host's key ---- */
/* Kafka headers signing p as the scheduler for `host`, now; NULL when out of memory. */
rd_kafka_headers_t *sch_hostmsg_headers(sch_ctx *ctx, const char *host, const void *p, size_t n);
/* Produces p to host's topic (sf.host.<host>), signed, untracked; 0 or -errno. */
int sch_hostmsg_produce(sch_ctx *ctx, const char *host, const char *key, const void *p, size_t n);

/* ---- pipeline.c: job -> auth -> validate -> route ---- */
/* 0 when every tool declared to run in the scheduler has a handler here (and back). */
int sch_pipeline_check(const sf_toolset *tools, char *why, size_t whylen);
void sch_on_job(void *arg, sf_job *job, sf_kafka_ticket tk);
void sch_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why);

/* ---- auth.c: who put a job on sf.jobs; a verdict, never an answer ---- */
enum { SCH_AUTH_OK, SCH_AUTH_REFUSED, SCH_AUTH_DOWN };
/* verdict: SCH_AUTH_OK (a producer's job now carries its key's team), SCH_AUTH_REFUSED
 * (text: the sentence for the caller, valid during the call), SCH_AUTH_DOWN (Redis did
 * not answer). Called exactly once, maybe before sch_auth_job returns. */
typedef void (*sch_auth_cb)(sch_call *c, int verdict, const char *text);
int sch_auth_init(sch_ctx *ctx, char *why, size_t whylen);
void sch_auth_job(sch_call *c, sch_auth_cb cb);

/* ---- the handlers: each finishes its call through call.c ---- */

/* route.c: a tool that runs on a host, to the host that owns its sandbox */
void sch_route_to_owner(sch_call *c);

/* list.c: sandbox_list and sandbox_info, from the records */
void sch_list_sandboxes(sch_call *c);
void sch_list_info(sch_call *c);

/* place.c: sandbox_create (limits, fair share, host choice, reservation) */
void sch_place_create(sch_call *c);

/* snapshots.c: the team's snapshots (list, delete), and sandbox_create's from_snapshot:
 * finds it, then places the create on its host with its shape (sch_place_create). */
void sch_snap_list(sch_call *c);
void sch_snap_delete(sch_call *c);
void sch_snap_place(sch_call *c);

/* egress.c: answered from Redis, no sandbox touched (a paused one stays paused) */
void sch_egress_secret_list(sch_call *c);   /* the team's secrets: metadata, never values */
void sch_egress_network_log(sch_call *c);   /* the sandbox's network log (limit, verdict) */

/* templates.c: the team's templates (list) and their builds (create, handed to hosts) */
void sch_tpl_list(sch_call *c);
void sch_tpl_create(sch_call *c);
void sch_tpl_delete(sch_call *c);

/* ---- below the handlers: reads and timers ---- */

/* hosts.c: the live hosts as placement sees them, read one host per call: cb gets a JSON
 * array (borrowed) of {h, cap, running, used (the most of running and reserved), mem,
 * vcpu (absent until the worker publishes them), rmem, rvcpu (reserved), deb (has
 * 'debian'), debb (is building it), driver (its name, for messages only), caps (what its
 * driver can do: {"layers", "builds", "snapshot_processes", "debian": true|false},
 * common/sf_hostcaps.h)}, or NULL when Redis did not answer. 0, or -errno (cb not called). */
typedef void (*sch_hosts_cb)(void *priv, json_t *hosts);
int sch_hosts_read(sch_ctx *ctx, sch_hosts_cb cb, void *priv);
/* A host of that array can do cap (SF_HOSTCAP_*): its heartbeat's caps say so. */
int sch_host_can(const json_t *host, unsigned cap);

/* reaper.c: removes dead hosts and runs tpl_join, every host_ttl_ms */
int sch_reaper_start(sch_ctx *ctx);
/* tpl_join.c: each live jail host gets the ready team templates another live host holds
 * (one pass at a time; run by the reaper's tick). */
void sch_tpl_join(sch_ctx *ctx);
void sch_tpl_join_fini(void); /* at exit, once Redis's callbacks ran */

#endif
