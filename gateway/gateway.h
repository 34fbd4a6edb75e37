/* The gateway: MCP Streamable HTTP in front, Kafka behind. It never touches a
 * sandbox: every tool call becomes a job on sf.jobs and waits for its reply. */
#ifndef GW_GATEWAY_H
#define GW_GATEWAY_H

#include "server.h"
#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_map.h"
#include "sf_redis.h"
#include "sf_tools.h"

#include <jansson.h>

typedef struct gw_team_table gw_team_table;

typedef struct gw_cfg {
    sf_common_cfg common;
    char *listen_addr;
    char *gateway_id;             /* stable id (reply topics sf.reply.<id>-<n>); "" = random */
    int64_t port;
    char *schemas_dir;
    char *auth_secret_file;
    int64_t max_body;
    int64_t max_buffered;       /* request bytes all connections together may hold */
    int64_t call_deadline_ms;   /* how long a call waits for its reply */
    int64_t exec_deadline_margin_ms; /* sandbox_exec waits its timeout_ms plus this */
    int64_t template_wait_s;    /* sandbox_create: plus this, for a template being built */
    int64_t max_pending;        /* calls waiting for replies */
    int64_t max_pending_team;   /* ...of which one team may have */
    int64_t session_ttl_s;
    int64_t max_sessions_team;  /* live MCP sessions one team may hold */
    char *allowed_origins;      /* comma-separated; localhost origins are always allowed */
    char *tls_cert_file;        /* PEM chain: TLS (ALPN h2, http/1.1) on the same port */
    char *tls_key_file;
    char *public_url;           /* how clients reach us (OAuth issuer, resource); "" = from Host */
    int64_t oauth_access_ttl_s; /* OAuth access token lifetime */
    int64_t oauth_refresh_ttl_s; /* OAuth refresh token (and grant) lifetime */
    int64_t oauth_register_per_min; /* registrations per source address a minute */
    int64_t oauth_clients_max;      /* unused registrations kept at once */
    int64_t oauth_signin_per_min;   /* sign-in pages per source address a minute */
    int64_t oauth_signins_max;      /* sign-in pages alive at once */
    int64_t oauth_cimd_timeout_ms; /* a client ID metadata document arrives within this */
    int64_t oauth_cimd_max_bytes;  /* ...and is at most this large */
    char *oauth_cimd_ca_file;      /* extra CA bundle for those fetches ("" = the system's) */
    int64_t oauth_cimd_cache_s;    /* a fetched document is used this long (0 = every time) */
    char *oauth_cimd_dir;          /* the operator's documents, used instead of fetching */
    int oauth_cimd_dir_any_redirect; /* ...which may then list non-loopback redirect URIs */
    int64_t key_cache_ms;       /* a verified API key is trusted this long without Redis */
    int64_t progress_interval_ms; /* a call with a progressToken hears from us this often */
    int access_log;             /* one info line per request */
    int64_t max_conns;
    int64_t max_conns_per_addr;
    int64_t max_buffered_per_addr;
    int64_t header_timeout_ms;
    int64_t body_timeout_ms;
    int64_t body_min_rate;
    int64_t threads;            /* event-loop threads (0 = one per core) */
    int64_t claim_team_mib;     /* a team's large arguments in Redis at once (claim checks) */
    char *preview_domain;       /* preview URLs: {port}-{label}.<this> (preview.h) */
    char *preview_scheme;       /* http or https */
    int64_t preview_max_conns_team; /* open preview connections one team may hold */
    int64_t preview_rate_team;  /* preview bytes/s one team may move (0 = no limit) */
    int64_t preview_hop_timeout_ms; /* the sandbox's host answers a hop within this */
    int64_t preview_local_hop;  /* 1: a worker on this machine passes the sandbox's socket */
} gw_cfg;

/* Counters for /metrics (metrics.c). */
#define GW_M_METHODS 4
#define GW_M_STATUSES 17
#define GW_M_BUCKETS 15
/* Written by the instance's own thread, read by any (relaxed atomics: GW_COUNT). */
typedef struct gw_metrics {
    unsigned long long requests[GW_M_METHODS][GW_M_STATUSES];
    unsigned long long aborted;
    unsigned long long latency[GW_M_BUCKETS + 1];
    unsigned long long latency_sum_us;
    unsigned long long unauthorized;  /* 401s */
    unsigned long long calls_refused; /* calls refused: too many in flight */
    unsigned long long refused[6];    /* the HTTP server's own refusals (gw_http_stats) */
    unsigned long long sessions, jobs, conns_h1, conns_h2; /* gauges, refreshed each second */
} gw_metrics;
#define GW_COUNT(x) __atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED)

typedef struct gw_session gw_session; /* session.h */

typedef struct gw_ctx {
    sf_daemon d;
    gw_cfg cfg;
    char id[SF_ID_MAX];
    char reply_topic[SF_TOPIC_MAX];
    uint8_t auth_secret[32];
    uint8_t job_key[32];      /* signs the jobs it puts on sf.jobs (sf_jobauth.h) */
    gw_http_server *http;
    gw_router *router;
    sf_redis *redis;
    sf_redis *redis_sub;      /* subscribed to SF_CH_GATEWAY (revocations, deleted sessions) */
    sf_map *key_cache;        /* key hash -> key_entry */
    sf_map *sess_cache;       /* session id -> gw_session (session.c) */
    struct gw_key_memo *key_memo; /* a key's tag -> its hash (auth.c) */
    sf_map *calls;            /* "<session>|<request id>" -> mcp_call, for cancellation */
    rd_kafka_t *producer, *consumer;
    sf_kafka_pump *pump;
    sf_map *pending;          /* job id -> gw_pending */
    struct event *cluster_tick; /* notices a restarted broker (a new cluster id) */
    struct event *drain_tick; /* SIGTERM: waits for the calls in flight, then ends the loop */
    int64_t drain_until;      /* (monotonic ms) the calls still waiting then are answered */
    int64_t drained_since;    /* when nothing was left in flight (0: something is) */
    _Atomic int draining;     /* new calls are refused: 503, another gateway takes them */
    _Atomic int kafka_down;   /* no broker reachable: calls fail fast (503) until a probe lands */
    int probing;              /* a probe message is on its way */
    char *cluster_id;         /* the Kafka cluster the jobs went to */
    gw_team_table *teams;     /* team -> its pending calls, shared by every thread */
    gw_team_table *own_teams; /* set when this instance made its own */
    sf_toolset tools;         /* the tool schemas */
    json_t *tools_list;       /* the tools/list result, built once */
    char *tools_list_text;    /* ...and encoded once */
    size_t tools_list_len;
    gw_metrics metrics;
    struct event *metrics_tick;
    struct gw_cimd *cimd;     /* client ID metadata document fetches (oauth_cimd.c) */
    struct gw_preview *preview; /* preview connections of this instance (preview.c) */
    struct gw_pv_teams *pv_teams; /* per-team preview counts, shared by every thread */
    json_t *cimd_local;       /* the operator's documents, this instance's copy (or NULL) */
    struct gw_ctx *peers;     /* every instance of this process (one per thread) */
    int npeers, index;
} gw_ctx;

/* jobs.c: publish a job and wait for its one final reply. The per-team count of calls in
 * flight is one table for the process (gw_team_table, thread-safe). */
gw_team_table *gw_team_table_new(size_t max);
void gw_team_table_free(gw_team_table *t);
#define GW_TOOL_CANCEL "sf.cancel"
/* tools/call _meta field: a client's key for one call (team-scoped, kept 24 h), so a retry
 * after a broken connection gets the first call's answer instead of running it again. */
#define GW_META_IDEMPOTENCY_KEY "sandfleet/idempotency_key"
typedef void (*gw_job_cb)(void *arg, const sf_reply *reply); /* reply NULL = deadline passed */
typedef void (*gw_progress_cb)(void *arg, const json_t *chunk); /* a `progress` reply */
typedef struct gw_pending gw_pending;
int gw_jobs_start(gw_ctx *ctx, char *why, size_t whylen);
void gw_jobs_stop(gw_ctx *ctx);
/* Publishes job (job->id, reply, deadline are filled in here) and calls cb exactly once,
 * unless cancelled first. 0 or negative errno (-E2BIG pending table full, -EDQUOT the
 * team's share of it used, -EMSGSIZE the job is over 1 MiB, -EIO Kafka). out may be NULL
 * (a job never cancelled: a kill sent on the way out). */
/* Answers every waiting call now (its "no answer in time" error): a drain that ran out
 * of time. */
void gw_jobs_fail_all(gw_ctx *ctx);
size_t gw_jobs_waiting(const gw_ctx *ctx);
/* What a call is told while no Kafka broker can be reached. */
#define GW_MSG_QUEUE_DOWN "The job queue is unreachable; retry in a few seconds."
int gw_jobs_submit(gw_ctx *ctx, sf_job *job, int64_t wait_ms, gw_job_cb cb, void *arg,
                   gw_pending **out);
void gw_jobs_cancel(gw_ctx *ctx, gw_pending *p);
/* Claim checks (sf_claim.h): the tool's claimable string arguments of at least
 * SF_CLAIM_MIN bytes go to Redis before the job is sent (job->id is set here if empty).
 * 0: nothing to store (cb is not called); 1: cb(arg, status) comes, with 0 (the job's args
 * now name their claims), -EDQUOT (the team's budget is spent), -ENOSPC (Redis is full) or
 * -EIO (Redis is down); -ENOMEM / -EIO now. job must stay until cb. */
typedef void (*gw_claims_cb)(void *arg, int status);
int gw_jobs_claim_args(gw_ctx *ctx, sf_job *job, const sf_tool *t, gw_claims_cb cb, void *arg);
/* Drops the claims of a job that will not be sent after all. */
void gw_jobs_claims_drop(gw_ctx *ctx, const sf_job *job);
/* Progress replies of p's job go to cb (job->progress must have been set). */
void gw_jobs_on_progress(gw_pending *p, gw_progress_cb cb);
/* The job's id. */
const char *gw_jobs_id(const gw_pending *p);
/* p's answer may be asked for again (an idempotent call): its claims are read and left to
 * their TTL instead of taken. */
void gw_jobs_keep_claims(gw_pending *p);
/* Fetches the claimed fields of a result r (taken: r is the caller's no more) into it, then
 * calls cb once with it, or with an error reply: `gone` when a claim no longer exists, else
 * the state store is unreachable. keep: read the claims and leave them (else take them). */
void gw_jobs_fetch_claims(gw_ctx *ctx, const char *team, sf_reply *r, int keep,
                          const char *gone, gw_job_cb cb, void *arg);
/* Tells the platform to stop p's job: an `sf.cancel` envelope (schemas/envelope.md) on sf.jobs,
 * keyed like the job; then forgets p (its callback never runs). 0 or -errno. */
int gw_jobs_abandon(gw_ctx *ctx, gw_pending *p);

/* auth.c: the credentials and session of a request, cached (see auth.c; sessions are
 * session.h's). */
int gw_auth_start(gw_ctx *ctx, char *why, size_t whylen);
void gw_auth_stop(gw_ctx *ctx);
void gw_auth_caches_clear(gw_ctx *ctx);
/* status: 200 ok (sess: the session when one was named, valid until the callback returns),
 * 401 bad/missing credentials (why: NULL when none was sent, else a sentence saying what is
 * wrong with the API key or OAuth access token), 404 another team's or a deleted session,
 * 503 Redis down. May call cb before returning (everything known). protocol: the client's
 * MCP-Protocol-Version (for a session recreated on the spot), or NULL. resource: the MCP
 * endpoint an OAuth access token must have been issued for (oauth.h). */
typedef void (*gw_auth_cb)(void *arg, int status, const char *team, gw_session *sess,
                           const char *why);
void gw_auth_check(gw_ctx *ctx, const char *authorization, const char *session_id,
                   const char *protocol, const char *resource, gw_auth_cb cb, void *arg);
/* mcp.c: what a tool that runs in the gateway (tools.h) may do with its call. */
typedef struct mcp_call mcp_call;
/* notifications/message (sent when the session's level lets it through and the call
 * streams). */
void gw_call_log(mcp_call *c, int level, const char *text);
/* notifications/progress (when the call has a progressToken). */
void gw_call_progress(mcp_call *c, double progress, double total, const char *message);
/* The final CallToolResult (stolen); ends the call. */
void gw_call_result(mcp_call *c, json_t *result);
/* Runs step `step` again after ms (one timer per call). */
void gw_call_later(mcp_call *c, int ms, int step);

/* metrics.c */
void gw_metrics_start(gw_ctx *ctx);           /* observes ctx->http */
void gw_metrics_stop(gw_ctx *ctx);
int gw_metrics_routes(gw_ctx *ctx);           /* /healthz, /readyz, /metrics */
void gw_metrics_kafka_error(const char *topic, const char *err);

/* mcp.c: POST/GET/DELETE /mcp (MCP Streamable HTTP) */
void gw_mcp_handle(gw_req *req, void *arg);
/* The head check (http/server.h): a body for /mcp is read only with a valid API key. */
void gw_mcp_head_check(gw_req *req, void *arg);
/* hosted.c: hosted MCP servers. True when req names one (/mcp/NAME, /mcp?name=NAME);
 * then gw_hosted_handle answers it. Routes: /mcp/ and the registry /v1/servers. */
int gw_hosted_wanted(gw_req *req);
void gw_hosted_handle(gw_req *req, gw_ctx *ctx);
int gw_hosted_routes(gw_ctx *ctx);
/* The gateway's routes on ctx->router (mcp.c): /mcp, /healthz; 0 or -ENOMEM. */
int gw_routes_add(gw_ctx *ctx);

#endif
