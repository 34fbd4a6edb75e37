/* sandfleet-gateway: parse config, build objects, run the loop, tear down. */
#include "gateway.h"
#include "oauth.h"
#include "preview.h"
#include "tools.h"
#include "sf_apikeys.h"
#include "sf_auth.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <event2/thread.h>

static const sf_cfg_entry cfg_table[] = {
    SF_COMMON_CFG_ENTRIES(gw_cfg),
    SF_CFG_S(gw_cfg, listen_addr, "127.0.0.1", "address the MCP endpoint listens on"),
    SF_CFG_S(gw_cfg, gateway_id, "",
             "stable id of this gateway ([a-z0-9_-]): a restart reuses its reply topics (the "
             "embedded broker cannot delete topics); empty = a new random id each start"),
    SF_CFG_I(gw_cfg, port, "8080", 0, 65535, "MCP port (0 = any free port)"),
    SF_CFG_S(gw_cfg, schemas_dir, "schemas/tools", SF_MSG_CFG_SCHEMAS_DIR),
    SF_CFG_S(gw_cfg, auth_secret_file, "/var/lib/sandfleet/auth.key",
             "32-byte secret the API key hashes are keyed with"),
    SF_CFG_I(gw_cfg, max_body, "16777216", 1024, 1073741824, "largest MCP request body (bytes)"),
    SF_CFG_I(gw_cfg, max_buffered, "268435456", 65536, 68719476736LL,
             "request bytes all connections together may hold (503 past it)"),
    SF_CFG_I(gw_cfg, call_deadline_ms, "30000", 100, 3600000,
             "how long a call waits for its answer"),
    SF_CFG_I(gw_cfg, template_wait_s, "600", 0, 3600,
             "sandbox_create waits this much longer (s) for a template still being built"),
    SF_CFG_I(gw_cfg, exec_deadline_margin_ms, "15000", 100, 3600000,
             "a tool with a wait argument (sandbox_exec: timeout_ms) waits it plus this"),
    SF_CFG_I(gw_cfg, max_pending, "10000", 1, 10000000, "calls waiting for answers at once"),
    SF_CFG_I(gw_cfg, claim_team_mib, "64", 16, 1048576,
             "MiB of large arguments (file writes) one team may have in Redis at once"),
    SF_CFG_I(gw_cfg, max_pending_team, "1000", 1, 10000000,
             "calls one team may have waiting at once"),
    SF_CFG_I(gw_cfg, session_ttl_s, "86400", 60, 31536000,
             "MCP session lifetime after its last use"),
    SF_CFG_I(gw_cfg, max_sessions_team, "1000", 1, 10000000,
             "live MCP sessions one team may hold"),
    SF_CFG_S(gw_cfg, allowed_origins, "", "extra allowed Origin values, comma-separated"),
    SF_CFG_S(gw_cfg, tls_cert_file, "",
             "PEM certificate chain: also serve TLS (h2 / http/1.1 by ALPN) on the port"),
    SF_CFG_S(gw_cfg, tls_key_file, "", "PEM private key of tls_cert_file"),
    SF_CFG_S(gw_cfg, public_url, "",
             "the URL clients reach this gateway at (OAuth issuer; default: from each request)"),
    SF_CFG_I(gw_cfg, oauth_access_ttl_s, "3600", 60, 86400, "OAuth access token lifetime (s)"),
    SF_CFG_I(gw_cfg, oauth_refresh_ttl_s, "2592000", 3600, 31536000,
             "OAuth refresh token lifetime (s); each use rotates it"),
    SF_CFG_I(gw_cfg, oauth_register_per_min, "20", 1, 100000,
             "dynamic client registrations one source address (an IPv6 /64) may make a minute"),
    SF_CFG_I(gw_cfg, oauth_clients_max, "10000", 1, 10000000,
             "registrations not yet used (by a sign-in) kept at once; more answer 429"),
    SF_CFG_I(gw_cfg, oauth_signin_per_min, "60", 1, 100000,
             "sign-in pages (GET /oauth/authorize) one source address may open a minute"),
    SF_CFG_I(gw_cfg, oauth_signins_max, "10000", 1, 10000000,
             "sign-in pages alive at once (each is kept 10 minutes); more answer 429"),
    SF_CFG_I(gw_cfg, oauth_cimd_timeout_ms, "5000", 100, 60000,
             "a client ID metadata document (an https client_id) must arrive within this"),
    SF_CFG_I(gw_cfg, oauth_cimd_max_bytes, "5120", 512, 65536,
             "largest client ID metadata document (bytes)"),
    SF_CFG_I(gw_cfg, oauth_cimd_cache_s, "300", 0, 86400,
             "a fetched client ID metadata document is used this long before it is fetched "
             "again (a refused one: 10 s at most; 0 = fetch every time)"),
    SF_CFG_S(gw_cfg, oauth_cimd_dir, "",
             "a folder of client ID metadata documents (*.json; gateway/cimd holds those of "
             "Claude Code and Codex): a sign-in whose client_id one names uses it instead of "
             "fetching (for machines without internet)"),
    SF_CFG_B(gw_cfg, oauth_cimd_dir_any_redirect, "0",
             "the documents of oauth_cimd_dir may list redirect URIs off loopback"),
    SF_CFG_S(gw_cfg, oauth_cimd_ca_file, "",
             "extra CA bundle (PEM) trusted for client ID metadata documents (default: the "
             "system's CAs)"),
    SF_CFG_I(gw_cfg, key_cache_ms, "10000", 0, 3600000,
             "a verified API key is trusted this long without asking Redis (revocations "
             "clear it at once; 0 = ask every time)"),
    SF_CFG_I(gw_cfg, progress_interval_ms, "15000", 50, 600000,
             "a call that asked for progress hears from the gateway at least this often"),
    SF_CFG_B(gw_cfg, access_log, "1", "log one line per request (request id, status, job id)"),
    SF_CFG_I(gw_cfg, max_conns, "4096", 16, 1000000, "open connections (503 past it)"),
    SF_CFG_I(gw_cfg, max_conns_per_addr, "256", 1, 1000000,
             "open connections from one client address (429 past it)"),
    SF_CFG_I(gw_cfg, max_buffered_per_addr, "0", 0, 68719476736LL,
             "request bytes one client address may hold (429 past it; 0 = a quarter of "
             "max_buffered, at least one largest request)"),
    SF_CFG_I(gw_cfg, header_timeout_ms, "10000", 100, 600000,
             "a request's line and headers must arrive within this (408)"),
    SF_CFG_I(gw_cfg, body_timeout_ms, "10000", 100, 600000,
             "a body must arrive within this plus its size at body_min_rate (408)"),
    SF_CFG_I(gw_cfg, body_min_rate, "1048576", 1024, 1073741824,
             "slowest body upload accepted, bytes per second"),
    SF_CFG_I(gw_cfg, threads, "0", 0, 64, "event-loop threads (0 = one per core)"),
    SF_CFG_S(gw_cfg, preview_domain, "preview.localhost:8080",
             "preview URLs are {port}-{label}.<this> (a host name, optional :port; any port "
             "is accepted); must not be the gateway's own site"),
    SF_CFG_S(gw_cfg, preview_scheme, "http", "http or https: the scheme of preview URLs"),
    SF_CFG_I(gw_cfg, preview_max_conns_team, "256", 1, 1000000,
             "open preview connections one team may hold on this gateway (429 page past it)"),
    SF_CFG_I(gw_cfg, preview_rate_team, "0", 0, 1099511627776LL,
             "preview bytes per second one team may move through this gateway, both ways "
             "together (0 = no limit)"),
    SF_CFG_I(gw_cfg, preview_hop_timeout_ms, "40000", 1000, 600000,
             "a sandbox's host must answer a preview hop within this (it may resume the "
             "sandbox first)"),
    SF_CFG_I(gw_cfg, preview_local_hop, "1", 0, 1,
             "1: a worker on this machine (same boot id) hands the gateway the connection into "
             "the sandbox over its local socket, and the gateway relays it alone (0: TCP hops "
             "only)"),
};

/* One event loop per thread, each a whole gateway instance (its own Redis connections,
 * Kafka producer, reply topic and HTTP server on the shared port with SO_REUSEPORT); the
 * kernel spreads connections over them. Instance 0 runs on the main thread and owns the
 * signals. */
static int instance_start(gw_ctx *ctx, int *port, gw_addr_table *addrs, char *why, size_t n)
{
    gw_http_limits lim = {0};

    ctx->d.kafka.on_delivery_error = gw_metrics_kafka_error;
    if (sf_auth_secret_load(ctx->cfg.auth_secret_file, ctx->auth_secret, why, n) < 0 ||
        gw_tools_load(ctx, why, n) < 0 ||
        !(ctx->redis = sf_redis_new(ctx->d.base, ctx->cfg.common.redis_url, why, n)) ||
        gw_auth_start(ctx, why, n) < 0 || gw_jobs_start(ctx, why, n) < 0)
        return -1;
    lim.max_body = (size_t)ctx->cfg.max_body;
    lim.max_buffered_bytes = (size_t)ctx->cfg.max_buffered;
    lim.max_conns = (unsigned)ctx->cfg.max_conns;
    lim.max_conns_per_addr = (unsigned)ctx->cfg.max_conns_per_addr;
    lim.max_buffered_per_addr = (size_t)ctx->cfg.max_buffered_per_addr;
    lim.header_timeout_ms = (unsigned)ctx->cfg.header_timeout_ms;
    lim.body_timeout_ms = (unsigned)ctx->cfg.body_timeout_ms;
    lim.body_min_rate = (size_t)ctx->cfg.body_min_rate;
    lim.reuse_port = 1;
    if (!(ctx->router = gw_router_new()) || gw_routes_add(ctx) < 0) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    if (!(ctx->http = gw_http_server_new(ctx->d.base, ctx->cfg.listen_addr, *port, &lim,
                                         gw_router_dispatch, ctx->router))) {
        snprintf(why, n, "cannot listen on %s port %d: %s", ctx->cfg.listen_addr, *port,
                 strerror(errno));
        return -1;
    }
    *port = gw_http_server_port(ctx->http); /* port 0: the others take the same one */
    gw_http_server_share_addrs(ctx->http, addrs);
    gw_http_server_enable_h2(ctx->http);
    gw_http_server_set_head_check(ctx->http, gw_mcp_head_check, ctx);
    if (gw_preview_start(ctx, why, n) < 0)
        return -1;
    gw_http_server_set_challenge(ctx->http, gw_oauth_challenge_fn, ctx);
    gw_metrics_start(ctx);
    if ((ctx->cfg.tls_cert_file[0] || ctx->cfg.tls_key_file[0]) &&
        gw_http_server_set_tls(ctx->http, ctx->cfg.tls_cert_file, ctx->cfg.tls_key_file, why,
                               n) < 0)
        return -1;
    return 0;
}

/* ---- SIGTERM: drain ---- */

/* Runs on each instance's own loop: nothing in flight for 200 ms (the answers are
 * written), or the drain time is up (what still waits is answered now): the loop ends. */
static void drain_check(evutil_socket_t fd, short what, void *arg)
{
    gw_ctx *ctx = arg;
    int64_t now = sf_mono_ms();

    if (now >= ctx->drain_until && gw_jobs_waiting(ctx) > 0) {
        sf_warn("msg=\"drain time is up; answering the calls still waiting\" calls=%zu",
                gw_jobs_waiting(ctx));
        gw_jobs_fail_all(ctx);
    }
    if (gw_jobs_waiting(ctx) > 0) {
        ctx->drained_since = 0;
        return;
    }
    if (!ctx->drained_since)
        ctx->drained_since = now;
    else if (now - ctx->drained_since >= 200)
        event_base_loopexit(ctx->d.base, NULL);
}

static void drain_begin(evutil_socket_t fd, short what, void *arg)
{
    gw_ctx *ctx = arg;
    struct timeval tick = {0, 50 * 1000};

    gw_http_server_stop_accepting(ctx->http);
    /* leave room before the shutdown deadline's watchdog */
    ctx->drain_until = sf_mono_ms() + ctx->cfg.common.shutdown_deadline_ms * 2 / 3;
    if (!(ctx->drain_tick = event_new(ctx->d.base, -1, EV_PERSIST, drain_check, ctx))) {
        event_base_loopexit(ctx->d.base, NULL);
        return;
    }
    event_add(ctx->drain_tick, &tick);
}

/* The first SIGTERM/SIGINT (on instance 0): every instance stops accepting and refuses
 * new calls, answers those in flight, then ends. */
static void drain_all(void *arg)
{
    gw_ctx *ctxs = arg;
    struct timeval now = {0, 0};

    sf_info("msg=\"draining: no new connections or calls; answering the calls in flight\"");
    for (int i = 0; i < ctxs[0].npeers; i++) {
        ctxs[i].draining = 1;
        if (event_base_once(ctxs[i].d.base, -1, EV_TIMEOUT, drain_begin, &ctxs[i], &now) < 0)
            event_base_loopexit(ctxs[i].d.base, NULL);
    }
}

static void instance_stop(gw_ctx *ctx)
{
    if (ctx->drain_tick)
        event_free(ctx->drain_tick);
    gw_metrics_stop(ctx);
    gw_preview_stop(ctx);
    gw_http_server_free(ctx->http);
    gw_cimd_stop(ctx);
    json_decref(ctx->cimd_local);
    ctx->cimd_local = NULL;
    gw_router_free(ctx->router);
    gw_jobs_stop(ctx);
    gw_auth_stop(ctx);
    sf_redis_free(ctx->redis);
    gw_tools_free(ctx);
    sf_daemon_fini(&ctx->d);
}

static void *instance_run(void *arg)
{
    gw_ctx *ctx = arg;
    event_base_dispatch(ctx->d.base);
    return NULL;
}

int main(int argc, char **argv)
{
    static gw_cfg cfg;
    gw_ctx *ctxs = NULL;
    pthread_t *threads = NULL;
    gw_addr_table *addrs = NULL;
    gw_team_table *teams = NULL;
    gw_pv_teams *pv_teams = NULL;
    json_t *cimd_local = NULL;
    char why[1024];
    int rc = 1, n, started = 0, port;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    switch (sf_config_main(argc, argv, "sandfleet-gateway", cfg_table, SF_ARRAY_LEN(cfg_table),
                           &cfg)) {
    case 1:
        return 0;
    case -1:
        return 2;
    }
    if (gw_cimd_local_load(cfg.oauth_cimd_dir, cfg.oauth_cimd_dir_any_redirect, &cimd_local, why,
                           sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet-gateway: %s.\n", why);
        sf_config_free(cfg_table, SF_ARRAY_LEN(cfg_table), &cfg);
        return 2;
    }
    n = cfg.threads > 0 ? (int)cfg.threads : (int)(cores > 0 ? (cores < 64 ? cores : 64) : 1);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) { /* before any thread */
        fprintf(stderr, "sandfleet-gateway: libcurl could not start\n");
        return 1;
    }
    if (evthread_use_pthreads() < 0 || !(ctxs = calloc((size_t)n, sizeof(*ctxs))) ||
        !(threads = calloc((size_t)n, sizeof(*threads))) || !(addrs = gw_addr_table_new()) ||
        !(teams = gw_team_table_new((size_t)cfg.max_pending)) ||
        !(pv_teams = gw_pv_teams_new())) {
        fprintf(stderr, "sandfleet-gateway: out of memory\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        ctxs[i].cfg = cfg; /* the strings are shared, read-only, freed once below */
        ctxs[i].peers = ctxs;
        ctxs[i].npeers = n;
        ctxs[i].index = i;
        ctxs[i].teams = teams;
        ctxs[i].pv_teams = pv_teams;
        if (sf_daemon_init(&ctxs[i].d, "gateway", &ctxs[i].cfg.common) < 0)
            goto out;
        started = i + 1;
        /* each loop its own copy: json_t reference counts are not shared across threads */
        if (cimd_local && !(ctxs[i].cimd_local = json_deep_copy(cimd_local)))
            goto out;
        if (i > 0) { /* signals belong to instance 0 */
            event_free(ctxs[i].d.ev_int);
            event_free(ctxs[i].d.ev_term);
            ctxs[i].d.ev_int = ctxs[i].d.ev_term = NULL;
        }
    }
    event_del(ctxs[0].d.ev_int); /* (re)install instance 0's handlers last */
    event_del(ctxs[0].d.ev_term);
    event_add(ctxs[0].d.ev_int, NULL);
    event_add(ctxs[0].d.ev_term, NULL);
    /* keys handed out before the {apikeys} slot keep working (state/sf_apikeys.h) */
    sf_apikeys_migrate_start(cfg.common.redis_url);
    port = (int)cfg.port;
    for (int i = 0; i < n; i++)
        if (instance_start(&ctxs[i], &port, addrs, why, sizeof(why)) < 0) {
            sf_error("msg=\"cannot start\" err=\"%s\"", why);
            goto out;
        }
    for (int i = 1; i < n; i++)
        if (pthread_create(&threads[i], NULL, instance_run, &ctxs[i]) != 0) {
            sf_error("msg=\"cannot start an event-loop thread\"");
            for (int j = 1; j < i; j++) {
                event_base_loopexit(ctxs[j].d.base, NULL);
                pthread_join(threads[j], NULL);
            }
            goto out;
        }
    sf_info("msg=\"gateway up\" url=http://%s:%d/mcp id=%s tools=%zu tls=%d h2=1 threads=%d",
            cfg.listen_addr, port, ctxs[0].id, ctxs[0].tools.n, cfg.tls_cert_file[0] != 0, n);
    ctxs[0].d.on_stop = drain_all;
    ctxs[0].d.on_stop_arg = ctxs;
    sf_daemon_ready();
    event_base_dispatch(ctxs[0].d.base);
    for (int i = 1; i < n && !ctxs[0].d.stopping; i++)
        event_base_loopexit(ctxs[i].d.base, NULL);
    for (int i = 1; i < n; i++)
        pthread_join(threads[i], NULL);
    rc = 0;
out:
    for (int i = 0; i < started; i++)
        instance_stop(&ctxs[i]);
    gw_addr_table_free(addrs);
    gw_team_table_free(teams);
    gw_pv_teams_free(pv_teams);
    free(threads);
    free(ctxs);
    json_decref(cimd_local);
    sf_config_free(cfg_table, SF_ARRAY_LEN(cfg_table), &cfg);
    curl_global_cleanup();
    return rc;
}
