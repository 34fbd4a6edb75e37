/* metrics.c: observability: the access log (one line per request, with its request id and
 * job id), Prometheus /metrics (requests by method and status, a latency histogram,
 * sessions, jobs in flight, refusals by reason), /healthz (the process answers) and
 * /readyz (Redis and Kafka reachable). */
#include "gateway.h"
#include "preview.h"
#include "sf_log.h"

#include <stdio.h>
#include <string.h>

static const char *const methods[GW_M_METHODS] = {"GET", "POST", "DELETE", "other"};
static const int statuses[GW_M_STATUSES - 1] = {200, 202, 204, 400, 401, 403, 404, 405, 406,
                                                408, 413, 415, 429, 431, 500, 503};
static const double buckets_ms[GW_M_BUCKETS] = {0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000,
                                                2500, 5000, 10000, 30000};

static void observe(gw_req *req, int status, void *arg)
{
    gw_ctx *ctx = arg;
    gw_metrics *m = &ctx->metrics;
    const char *method = gw_req_method(req);
    double ms = (double)gw_req_elapsed_us(req) / 1000.0;
    size_t mi = GW_M_METHODS - 1, si = GW_M_STATUSES - 1, b = 0;

    for (size_t i = 0; i + 1 < GW_M_METHODS; i++)
        if (!strcmp(method, methods[i]))
            mi = i;
    for (size_t i = 0; i + 1 < GW_M_STATUSES; i++)
        if (statuses[i] == status)
            si = i;
    if (status == 0)
        GW_COUNT(m->aborted);
    else
        GW_COUNT(m->requests[mi][si]);
    while (b < GW_M_BUCKETS && ms > buckets_ms[b])
        b++;
    GW_COUNT(m->latency[b]);
    __atomic_fetch_add(&m->latency_sum_us, gw_req_elapsed_us(req), __ATOMIC_RELAXED);
    if (ctx->cfg.access_log)
        sf_info("msg=access req=%s method=%s path=%s status=%d proto=%s peer=%s us=%llu job=%s",
                gw_req_id(req), method, gw_req_path(req), status, gw_req_protocol(req),
                gw_req_peer(req), (unsigned long long)gw_req_elapsed_us(req),
                gw_req_job(req)[0] ? gw_req_job(req) : "-");
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* Each second, the instance's gauges and its server's refusal counts are published for
 * /metrics, which any instance may render. */
static void tick(evutil_socket_t fd, short what, void *arg)
{
    gw_ctx *ctx = arg;
    gw_metrics *m = &ctx->metrics;
    const gw_http_stats *st = gw_http_server_stats(ctx->http);

    STORE(m->sessions, ctx->sess_cache ? sf_map_len(ctx->sess_cache) : 0);
    STORE(m->jobs, ctx->pending ? sf_map_len(ctx->pending) : 0);
    STORE(m->conns_h1, gw_http_server_conns(ctx->http));
    STORE(m->conns_h2, gw_http_server_h2_conns(ctx->http));
    for (size_t i = 0; i < SF_ARRAY_LEN(m->refused); i++)
        STORE(m->refused[i], st->refused[i]);
}

void gw_metrics_start(gw_ctx *ctx)
{
    struct timeval one = {1, 0};

    gw_http_server_set_observer(ctx->http, observe, ctx);
    if ((ctx->metrics_tick = event_new(ctx->d.base, -1, EV_PERSIST, tick, ctx)))
        event_add(ctx->metrics_tick, &one);
}

void gw_metrics_stop(gw_ctx *ctx)
{
    if (ctx->metrics_tick)
        event_free(ctx->metrics_tick);
    ctx->metrics_tick = NULL;
}

/* The sum over every instance of the process. */
#define SUM(field)                                                                         \
    ({                                                                                     \
        unsigned long long s_ = 0;                                                         \
        for (int p_ = 0; p_ < ctx->npeers; p_++)                                           \
            s_ += LOAD(ctx->peers[p_].metrics.field);                                      \
        s_;                                                                                \
    })

static void metrics_page(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    static const char *const reasons[] = {"bad_request", "timeout", "too_large",
                                          "too_many", "headers_too_large", "busy"};
    static const char *const hdr[] = {"Cache-Control", "no-store", NULL};
    unsigned long long cum = 0;
    sf_buf b;

    sf_buf_init(&b, 64 << 10);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_requests_total Requests answered, by method and status.\n"
                       "# TYPE sandfleet_gateway_requests_total counter\n");
    tick(-1, 0, ctx); /* this instance's gauges: now */
    for (size_t i = 0; i < GW_M_METHODS; i++)
        for (size_t j = 0; j < GW_M_STATUSES; j++) {
            unsigned long long v = SUM(requests[i][j]);
            if (!v)
                continue;
            if (j + 1 < GW_M_STATUSES)
                sf_buf_appendf(&b, "sandfleet_gateway_requests_total{method=\"%s\",status=\"%d\"} %llu\n",
                               methods[i], statuses[j], v);
            else
                sf_buf_appendf(&b, "sandfleet_gateway_requests_total{method=\"%s\",status=\"other\"} %llu\n",
                               methods[i], v);
        }
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_requests_aborted_total Requests whose client left first.\n"
                       "# TYPE sandfleet_gateway_requests_aborted_total counter\n"
                       "sandfleet_gateway_requests_aborted_total %llu\n", SUM(aborted));
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_request_duration_seconds Time to the answer.\n"
                       "# TYPE sandfleet_gateway_request_duration_seconds histogram\n");
    for (size_t i = 0; i < GW_M_BUCKETS; i++) {
        cum += SUM(latency[i]);
        sf_buf_appendf(&b, "sandfleet_gateway_request_duration_seconds_bucket{le=\"%g\"} %llu\n",
                       buckets_ms[i] / 1000.0, cum);
    }
    cum += SUM(latency[GW_M_BUCKETS]);
    sf_buf_appendf(&b, "sandfleet_gateway_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
                       "sandfleet_gateway_request_duration_seconds_sum %.6f\n"
                       "sandfleet_gateway_request_duration_seconds_count %llu\n",
                   cum, (double)SUM(latency_sum_us) / 1e6, cum);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_threads Event-loop threads.\n"
                       "# TYPE sandfleet_gateway_threads gauge\nsandfleet_gateway_threads %d\n",
                   ctx->npeers);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_sessions MCP sessions this gateway knows.\n"
                       "# TYPE sandfleet_gateway_sessions gauge\nsandfleet_gateway_sessions %llu\n",
                   SUM(sessions));
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_jobs_in_flight Calls waiting for their job's reply.\n"
                       "# TYPE sandfleet_gateway_jobs_in_flight gauge\nsandfleet_gateway_jobs_in_flight %llu\n",
                   SUM(jobs));
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_connections Open connections by protocol.\n"
                       "# TYPE sandfleet_gateway_connections gauge\n"
                       "sandfleet_gateway_connections{protocol=\"http1\"} %llu\n"
                       "sandfleet_gateway_connections{protocol=\"http2\"} %llu\n",
                   SUM(conns_h1), SUM(conns_h2));
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_refused_total Requests the server refused by itself, by reason.\n"
                       "# TYPE sandfleet_gateway_refused_total counter\n");
    for (size_t i = 0; i < SF_ARRAY_LEN(reasons); i++)
        sf_buf_appendf(&b, "sandfleet_gateway_refused_total{reason=\"%s\"} %llu\n", reasons[i],
                       SUM(refused[i]));
    sf_buf_appendf(&b, "sandfleet_gateway_refused_total{reason=\"unauthorized\"} %llu\n"
                       "sandfleet_gateway_refused_total{reason=\"calls_in_flight\"} %llu\n",
                   SUM(unauthorized), SUM(calls_refused));
    if (ctx->pv_teams)
        gw_pv_teams_metrics(ctx->pv_teams, &b);
    gw_req_respond(req, 200, "text/plain; version=0.0.4", hdr, b.p, b.len);
    sf_buf_fini(&b);
}

static void healthz(gw_req *req, void *arg)
{
    static const char ok[] = "{\"status\":\"ok\"}";
    gw_req_respond(req, 200, "application/json", NULL, ok, sizeof(ok) - 1);
}

/* Kafka counts as reachable while no job failed delivery in the last 10 s and the
 * producer's queue is not piling up. */
static _Atomic int64_t kafka_error_ms;

void gw_metrics_kafka_error(const char *topic, const char *err)
{
    kafka_error_ms = sf_mono_ms();
    sf_warn("msg=\"Kafka refused a message\" topic=%s err=\"%s\"", topic, err);
}

/* Ready to serve: Redis connected and Kafka reachable. */
static void readyz(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    int64_t last = kafka_error_ms;
    int redis = sf_redis_connected(ctx->redis);
    int kafka = ctx->producer && !ctx->kafka_down && rd_kafka_outq_len(ctx->producer) < 10000 &&
                (last == 0 || sf_mono_ms() - last > 10000);
    char body[128];
    int n = snprintf(body, sizeof(body), "{\"status\":\"%s\",\"redis\":%s,\"kafka\":%s}",
                     redis && kafka ? "ready" : "not ready", redis ? "true" : "false",
                     kafka ? "true" : "false");

    gw_req_respond(req, redis && kafka ? 200 : 503, "application/json", NULL, body, (size_t)n);
}

int gw_metrics_routes(gw_ctx *ctx)
{
    if (gw_router_add(ctx->router, "GET", "/healthz", healthz, ctx) < 0 ||
        gw_router_add(ctx->router, "GET", "/readyz", readyz, ctx) < 0 ||
        gw_router_add(ctx->router, "GET", "/metrics", metrics_page, ctx) < 0)
        return -ENOMEM;
    return 0;
}
