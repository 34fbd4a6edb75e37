/* The gateway: MCP Streamable HTTP in front, Kafka behind. It never touches a
 * sandbox: every tool call becomes a job on sf.jobs and waits for its reply. */
#ifndef GW_GATEWAY_H
#define GW_GATEWAY_H

#include "http1.h"
#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_map.h"
#include "sf_redis.h"
#include "sf_tools.h"

#include <jansson.h>

typedef struct gw_cfg {
    sf_common_cfg common;
    char *listen_addr;
    int64_t port;
    char *schemas_dir;
    char *auth_secret_file;
    int64_t max_body;
    int64_t max_buffered;       /* request bytes all connections together may hold */
    int64_t call_deadline_ms;   /* how long a call waits for its reply */
    int64_t exec_deadline_margin_ms; /* sandbox_exec waits its timeout_ms plus this */
    int64_t max_pending;        /* calls waiting for replies */
    int64_t max_pending_team;   /* ...of which one team may have */
    int64_t session_ttl_s;
    int64_t max_sessions_team;  /* live MCP sessions one team may hold */
    char *allowed_origins;      /* comma-separated; localhost origins are always allowed */
    char *tls_cert_file;        /* PEM chain: TLS (ALPN h2, http/1.1) on the same port */
    char *tls_key_file;
} gw_cfg;

typedef struct gw_ctx {
    sf_daemon d;
    gw_cfg cfg;
    char id[SF_ID_MAX];
    char reply_topic[SF_TOPIC_MAX];
    uint8_t auth_secret[32];
    gw_http_server *http;
    gw_router *router;
    sf_redis *redis;
    rd_kafka_t *producer, *consumer;
    sf_kafka_pump *pump;
    sf_map *pending;          /* job id -> gw_pending */
    sf_map *team_pending;     /* team -> count of its pending calls (int *) */
    sf_toolset tools;         /* the tool schemas */
    json_t *tools_list;       /* the tools/list result, built once */
} gw_ctx;

/* tools.c */
int gw_tools_load(gw_ctx *ctx, char *why, size_t whylen);
void gw_tools_free(gw_ctx *ctx);

/* jobs.c: publish a job and wait for its one final reply. */
typedef void (*gw_job_cb)(void *arg, const sf_reply *reply); /* reply NULL = deadline passed */
typedef struct gw_pending gw_pending;
int gw_jobs_start(gw_ctx *ctx, char *why, size_t whylen);
void gw_jobs_stop(gw_ctx *ctx);
/* Publishes job (job->id, reply, deadline are filled in here) and calls cb exactly once,
 * unless cancelled first. 0 or negative errno (-E2BIG pending table full, -EDQUOT the
 * team's share of it used, -EMSGSIZE the job is over 1 MiB, -EIO Kafka). */
int gw_jobs_submit(gw_ctx *ctx, sf_job *job, int64_t wait_ms, gw_job_cb cb, void *arg,
                   gw_pending **out);
void gw_jobs_cancel(gw_ctx *ctx, gw_pending *p);

/* auth.c: API key and MCP session checks (one Redis round trip). */
typedef void (*gw_auth_cb)(void *arg, int status, const char *team);
/* status: 200 ok, 401 bad/missing key, 404 unknown session, 503 Redis down. */
void gw_auth_check(gw_ctx *ctx, const char *authorization, const char *session_id, gw_auth_cb cb,
                   void *arg);
/* status: 200 and the new session id, 429 the team has max_sessions_team, 503 Redis down. */
typedef void (*gw_session_cb)(void *arg, int status, const char *sid);
void gw_session_create(gw_ctx *ctx, const char *team, const char *protocol, gw_session_cb cb,
                       void *arg);
void gw_session_delete(gw_ctx *ctx, const char *team, const char *sid);

/* mcp.c: POST/GET/DELETE /mcp (MCP Streamable HTTP) */
void gw_mcp_handle(gw_req *req, void *arg);
/* The gateway's routes on ctx->router (mcp.c): /mcp, /healthz; 0 or -ENOMEM. */
int gw_routes_add(gw_ctx *ctx);

#endif
