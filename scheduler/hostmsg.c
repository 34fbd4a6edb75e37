/* hostmsg.c: messages to one host's topic (sf.host.<host>), signed as the scheduler with
 * that host's key (sf_host_job_key, derived from the auth secret), which the worker checks
 * before it takes any (worker/hostauth.c). */
#include "sched.h"
#include "sf_auth.h"
#include "sf_jobauth.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>

rd_kafka_headers_t *sch_hostmsg_headers(sch_ctx *ctx, const char *host, const void *p, size_t n)
{
    uint8_t key[32];
    rd_kafka_headers_t *h;

    sf_host_job_key(ctx->auth_secret, host, key);
    h = sf_jobauth_headers(p, n, SF_JOBAUTH_SCHEDULER, key, sf_now_ms());
    sodium_memzero(key, sizeof(key));
    return h;
}

int sch_hostmsg_produce(sch_ctx *ctx, const char *host, const char *key, const void *p, size_t n)
{
    char topic[SF_TOPIC_MAX];
    rd_kafka_headers_t *h = sch_hostmsg_headers(ctx, host, p, n);
    int rc;

    if (!h)
        return -ENOMEM;
    snprintf(topic, sizeof(topic), SF_TOPIC_HOST_PREFIX "%s", host);
    if ((rc = sf_kafka_produce_h(ctx->producer, topic, key, p, n, h, NULL, NULL)) < 0)
        rd_kafka_headers_destroy(h);
    return rc;
}
