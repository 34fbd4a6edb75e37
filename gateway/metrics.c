/* metrics.c: observability: the access log (one line per request, with its request id and
 * job id), Prometheus /metrics (requests by method and status, a latency histogram,
 * sessions, jobs in flight, refusals by reason), /healthz (the process answers) and
 * /readyz (Redis and Kafka reachable). */
#include "gateway.h"
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
        m->aborted++;
    else
        m->requests[mi][si]++;
    while (b < GW_M_BUCKETS && ms > buckets_ms[b])
        b++;
    m->latency[b]++;
    m->latency_sum_ms += ms;
    if (ctx->cfg.access_log)
        sf_info("msg=access req=%s method=%s path=%s status=%d proto=%s peer=%s us=%llu job=%s",
                gw_req_id(req), method, gw_req_path(req), status, gw_req_protocol(req),
                gw_req_peer(req), (unsigned long long)gw_req_elapsed_us(req),
                gw_req_job(req)[0] ? gw_req_job(req) : "-");
}

void gw_metrics_start(gw_ctx *ctx)
{
    gw_http_server_set_observer(ctx->http, observe, ctx);
}

static void metrics_page(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    const gw_metrics *m = &ctx->metrics;
    const gw_http_stats *st = gw_http_server_stats(ctx->http);
    static const char *const reasons[] = {"bad_request", "timeout", "too_large",
                                          "too_many", "headers_too_large", "busy"};
    static const char *const hdr[] = {"Cache-Control", "no-store", NULL};
    unsigned long long cum = 0;
    sf_buf b;

    sf_buf_init(&b, 64 << 10);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_requests_total Requests answered, by method and status.\n"
                       "# TYPE sandfleet_gateway_requests_total counter\n");
    for (size_t i = 0; i < GW_M_METHODS; i++)
        for (size_t j = 0; j < GW_M_STATUSES; j++)
            if (m->requests[i][j]) {
                if (j + 1 < GW_M_STATUSES)
                    sf_buf_appendf(&b, "sandfleet_gateway_requests_total{method=\"%s\",status=\"%d\"} %llu\n",
                                   methods[i], statuses[j], m->requests[i][j]);
                else
                    sf_buf_appendf(&b, "sandfleet_gateway_requests_total{method=\"%s\",status=\"other\"} %llu\n",
                                   methods[i], m->requests[i][j]);
            }
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_requests_aborted_total Requests whose client left first.\n"
                       "# TYPE sandfleet_gateway_requests_aborted_total counter\n"
                       "sandfleet_gateway_requests_aborted_total %llu\n", m->aborted);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_request_duration_seconds Time to the answer.\n"
                       "# TYPE sandfleet_gateway_request_duration_seconds histogram\n");
    for (size_t i = 0; i < GW_M_BUCKETS; i++) {
        cum += m->latency[i];
        sf_buf_appendf(&b, "sandfleet_gateway_request_duration_seconds_bucket{le=\"%g\"} %llu\n",
                       buckets_ms[i] / 1000.0, cum);
    }
    cum += m->latency[GW_M_BUCKETS];
    sf_buf_appendf(&b, "sandfleet_gateway_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
                       "sandfleet_gateway_request_duration_seconds_sum %.6f\n"
                       "sandfleet_gateway_request_duration_seconds_count %llu\n",
                   cum, m->latency_sum_ms / 1000.0, cum);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_sessions MCP sessions this gateway knows.\n"
                       "# TYPE sandfleet_gateway_sessions gauge\nsandfleet_gateway_sessions %zu\n",
                   ctx->sess_cache ? sf_map_len(ctx->sess_cache) : 0);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_jobs_in_flight Calls waiting for their job's reply.\n"
                       "# TYPE sandfleet_gateway_jobs_in_flight gauge\nsandfleet_gateway_jobs_in_flight %zu\n",
                   ctx->pending ? sf_map_len(ctx->pending) : 0);
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_connections Open connections by protocol.\n"
                       "# TYPE sandfleet_gateway_connections gauge\n"
                       "sandfleet_gateway_connections{protocol=\"http1\"} %u\n"
                       "sandfleet_gateway_connections{protocol=\"http2\"} %u\n",
                   gw_http_server_conns(ctx->http), gw_http_server_h2_conns(ctx->http));
    sf_buf_appendf(&b, "# HELP sandfleet_gateway_refused_total Requests the server refused by itself, by reason.\n"
                       "# TYPE sandfleet_gateway_refused_total counter\n");
    for (size_t i = 0; i < SF_ARRAY_LEN(reasons); i++)
        sf_buf_appendf(&b, "sandfleet_gateway_refused_total{reason=\"%s\"} %llu\n", reasons[i],
                       st->refused[i]);
    sf_buf_appendf(&b, "sandfleet_gateway_refused_total{reason=\"unauthorized\"} %llu\n"
                       "sandfleet_gateway_refused_total{reason=\"calls_in_flight\"} %llu\n",
                   m->unauthorized, m->calls_refused);
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
    int kafka = ctx->producer && rd_kafka_outq_len(ctx->producer) < 10000 &&
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
