/* auth.c: who put a job on sf.jobs. Every job carries a signature in its Kafka headers
 * (common/sf_jobauth.h, schemas/envelope.md): a gateway's, made with the gateways'
 * credential (derived from the auth secret), or a producer's, made with the credential of
 * one API key (sealed in sf:pkey:{id}); a producer's job takes its team from the key, is
 * taken only within SF_JOBAUTH_WINDOW_MS of its signing, and once (its MAC is remembered:
 * a copy at another offset is a replay). Anything else is answered `unauthenticated` and
 * copied to sf.dead. */
#include "sched.h"
#include "sf_auth.h"
#include "sf_jobauth.h"
#include "sf_kafka.h"
#include "sf_log.h"
#include "sf_store.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sch_auth_init(sch_ctx *ctx, char *why, size_t whylen)
{
    if (sf_auth_secret_load(ctx->cfg.auth_secret_file, ctx->auth_secret, why, whylen) < 0)
        return -1;
    sf_gateway_job_key(ctx->auth_secret, ctx->gateway_key);
    return 0;
}

rd_kafka_headers_t *sch_host_headers(sch_ctx *ctx, const char *host, const void *p, size_t n)
{
    uint8_t key[32];
    rd_kafka_headers_t *h;

    sf_host_job_key(ctx->auth_secret, host, key);
    h = sf_jobauth_headers(p, n, SF_JOBAUTH_SCHEDULER, key, sf_now_ms());
    sodium_memzero(key, sizeof(key));
    return h;
}

int sch_host_produce(sch_ctx *ctx, const char *host, const char *key, const void *p, size_t n)
{
    char topic[SF_TOPIC_MAX];
    rd_kafka_headers_t *h = sch_host_headers(ctx, host, p, n);
    int rc;

    if (!h)
        return -ENOMEM;
    snprintf(topic, sizeof(topic), SF_TOPIC_HOST_PREFIX "%s", host);
    if ((rc = sf_kafka_produce_h(ctx->producer, topic, key, p, n, h, NULL, NULL)) < 0)
        rd_kafka_headers_destroy(h);
    return rc;
}

/* Answers the call `unauthenticated` with text, after copying the job to sf.dead. */
static void refuse(sch_call *c, const char *text)
{
    sf_buf b;

    sf_buf_init(&b, SF_MSG_MAX);
    if (sf_job_encode(&c->job, &b) == 0)
        sf_kafka_produce(c->ctx->producer, SF_TOPIC_DEAD, "unauthenticated", b.p, b.len);
    sf_buf_fini(&b);
    sf_warn("msg=\"job refused\" job=%s key=%s why=\"%s\"", c->job.id, c->job.auth.key, text);
    c->silent = 0; /* an unauthenticated sender is told, whatever tool it names */
    sch_reply_error(c, SF_ERR_UNAUTH, text);
}

static int producer_id_valid(const char *id)
{
    if (strlen(id) != SF_PRODUCER_ID_LEN || id[0] != 'p')
        return 0;
    for (size_t i = 1; i < SF_PRODUCER_ID_LEN; i++)
        if (!strchr("0123456789abcdef", id[i]))
            return 0;
    return 1;
}

static void on_seen(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    char here[48];

    (void)ac;
    snprintf(here, sizeof(here), "%" PRId32 ":%" PRId64, c->ticket.partition, c->ticket.offset);
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    /* nil: first sight; the same offset again: Kafka redelivered it (a scheduler died) */
    if (rep->type == REDIS_REPLY_NIL ||
        (rep->type == REDIS_REPLY_STRING && !strcmp(rep->str, here))) {
        sch_route_job(c);
        return;
    }
    refuse(c, "This signed job was already taken once (a replay of the same message); sign "
              "it again to send it again (the same job id returns the first run's answer).");
}

static void on_producer(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    uint8_t psk[32];
    char mac_hex[33], here[48], text[256];

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (rep->element[0]->type != REDIS_REPLY_STRING || rep->element[1]->type != REDIS_REPLY_STRING ||
        !sf_id_valid(rep->element[0]->str)) {
        snprintf(text, sizeof(text), "The job's key %s is unknown or revoked; create a key with "
                 "'sandfleet keys create' and sign with it.", c->job.auth.key);
        refuse(c, text);
        return;
    }
    if (sf_psk_unseal(c->ctx->auth_secret, c->job.auth.key, rep->element[1]->str, psk) < 0) {
        sf_error("msg=\"a producer credential does not open with this auth secret\" key=%s",
                 c->job.auth.key);
        refuse(c, "The job's key cannot be checked by this scheduler (its auth secret differs "
                  "from the one the key was made with); tell the operator.");
        return;
    }
    if (sf_jobauth_check(&c->job.auth, psk) < 0) {
        sodium_memzero(psk, sizeof(psk));
        refuse(c, "The job's HMAC (sf-mac) does not match its key; sign the exact message bytes "
                  "as schemas/envelope.md says.");
        return;
    }
    sodium_memzero(psk, sizeof(psk));
    snprintf(c->job.team, sizeof(c->job.team), "%s", rep->element[0]->str); /* never the job's */
    sodium_bin2hex(mac_hex, sizeof(mac_hex), c->job.auth.mac, 16);
    snprintf(here, sizeof(here), "%" PRId32 ":%" PRId64, c->ticket.partition, c->ticket.offset);
    if (sf_redis_cmd(c->ctx->redis, on_seen, c, "SET " SF_RK_PRODUCER_SEEN " %s NX GET PX %d",
                     c->job.auth.key, mac_hex, here,
                     SF_JOBAUTH_WINDOW_MS + SF_JOBAUTH_SKEW_MS) < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

void sch_auth_job(sch_call *c)
{
    const sf_job_auth *a = &c->job.auth;
    int64_t now = sf_now_ms();
    size_t klen = strlen(a->key);
    char text[512];

    if (a->state == 0) {
        if (c->ctx->cfg.accept_unsigned) {
            sch_route_job(c);
            return;
        }
        refuse(c, "The job is not signed; put it on sf.jobs with the sf-key, sf-iat and sf-mac "
                  "headers schemas/envelope.md describes.");
        return;
    }
    if (a->state < 0) {
        snprintf(text, sizeof(text), "The job's signature cannot be read: %s; sign it as "
                 "schemas/envelope.md says.", a->why);
        refuse(c, text);
        return;
    }
    if (!strcmp(a->key, SF_JOBAUTH_GATEWAY)) {
        if (sf_jobauth_check(a, c->ctx->gateway_key) < 0) {
            refuse(c, "The job claims to come from a gateway but its HMAC does not match the "
                      "gateways' credential; only gateways sign as 'gateway'.");
            return;
        }
        /* fresh too: a captured gateway job put back on the queue later is refused (a
         * gateway signs again whenever it publishes, a retry after a broker restart too) */
        if (a->iat < now - SF_JOBAUTH_WINDOW_MS || a->iat > now + SF_JOBAUTH_SKEW_MS) {
            snprintf(text, sizeof(text), "The job expired: a gateway signed it %lld s %s and "
                     "signed jobs are taken for %d s after signing; call again.",
                     (long long)(llabs(now - a->iat) / 1000), a->iat > now ? "ahead" : "ago",
                     SF_JOBAUTH_WINDOW_MS / 1000);
            refuse(c, text);
            return;
        }
        sch_route_job(c);
        return;
    }
    if (!producer_id_valid(a->key)) {
        refuse(c, "The job's sf-key is not a producer id ('p' and 20 hex characters, derived "
                  "from the API key as schemas/envelope.md says).");
        return;
    }
    if (strncmp(c->job.id, a->key, klen) != 0 || c->job.id[klen] != '-') {
        snprintf(text, sizeof(text), "A signed job's id must start with its producer id and "
                 "'-' (%s-...); rename the job.", a->key);
        refuse(c, text);
        return;
    }
    if (a->iat < now - SF_JOBAUTH_WINDOW_MS) {
        snprintf(text, sizeof(text), "The job expired: it was signed %lld s ago and signed jobs "
                 "are taken for %d s; sign it again.", (long long)((now - a->iat) / 1000),
                 SF_JOBAUTH_WINDOW_MS / 1000);
        refuse(c, text);
        return;
    }
    if (a->iat > now + SF_JOBAUTH_SKEW_MS) {
        refuse(c, "The job was signed more than 60 s in the future; fix the producer's clock.");
        return;
    }
    if (sf_redis_cmd(c->ctx->redis, on_producer, c, "HMGET " SF_RK_PRODUCER " team psk",
                     a->key) < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
