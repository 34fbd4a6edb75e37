/* auth.c: who put a job on sf.jobs. Every job carries a signature in its Kafka headers
 * (common/sf_jobauth.h, schemas/envelope.md): a gateway's, made with the gateways'
 * credential (derived from the auth secret), or a producer's, made with the credential of
 * one API key (sealed in sf:pkey:{id}); a producer's job takes its team from the key, is
 * taken only within SF_JOBAUTH_WINDOW_MS of its signing, and once (its MAC is remembered:
 * a copy at another offset is a replay). The check ends in a verdict for the pipeline
 * (pipeline.c), which answers a refused job `unauthenticated` and copies it to sf.dead;
 * nothing here answers a call. */
#include "sched.h"
#include "sf_auth.h"
#include "sf_jobauth.h"
#include "sf_log.h"
#include "sf_store.h"

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

/* One check under way: the call and who hears the verdict. */
typedef struct auth_op {
    sch_call *c;
    sch_auth_cb cb;
} auth_op;

/* Tells op's caller the verdict and ends op. */
static void verdict(auth_op *op, int v, const char *text)
{
    sch_auth_cb cb = op->cb;
    sch_call *c = op->c;

    free(op);
    cb(c, v, text);
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
    auth_op *op = priv;
    sch_call *c = op->c;
    char here[48];

    (void)ac;
    snprintf(here, sizeof(here), "%" PRId32 ":%" PRId64, c->call.ticket.partition,
             c->call.ticket.offset);
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        verdict(op, SCH_AUTH_DOWN, NULL);
        return;
    }
    /* nil: first sight; the same offset again: Kafka redelivered it (a scheduler died) */
    if (rep->type == REDIS_REPLY_NIL ||
        (rep->type == REDIS_REPLY_STRING && !strcmp(rep->str, here))) {
        verdict(op, SCH_AUTH_OK, NULL);
        return;
    }
    verdict(op, SCH_AUTH_REFUSED, "This signed job was already taken once (a replay of the same message); sign "
              "it again to send it again (the same job id returns the first run's answer).");
}

static void on_producer(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    auth_op *op = priv;
    sch_call *c = op->c;
    uint8_t psk[32];
    char mac_hex[33], here[48], text[256];

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        verdict(op, SCH_AUTH_DOWN, NULL);
        return;
    }
    if (rep->element[0]->type != REDIS_REPLY_STRING || rep->element[1]->type != REDIS_REPLY_STRING ||
        !sf_id_valid(rep->element[0]->str)) {
        snprintf(text, sizeof(text), "The job's key %s is unknown or revoked; create a key with "
                 "'sandfleet keys create' and sign with it.", c->job.auth.key);
        verdict(op, SCH_AUTH_REFUSED, text);
        return;
    }
    if (sf_psk_unseal(c->ctx->auth_secret, c->job.auth.key, rep->element[1]->str, psk) < 0) {
        sf_error("msg=\"a producer credential does not open with this auth secret\" key=%s",
                 c->job.auth.key);
        verdict(op, SCH_AUTH_REFUSED, "The job's key cannot be checked by this scheduler (its auth secret differs "
                  "from the one the key was made with); tell the operator.");
        return;
    }
    if (sf_jobauth_check(&c->job.auth, psk) < 0) {
        sodium_memzero(psk, sizeof(psk));
        verdict(op, SCH_AUTH_REFUSED, "The job's HMAC (sf-mac) does not match its key; sign the exact message bytes "
                  "as schemas/envelope.md says.");
        return;
    }
    sodium_memzero(psk, sizeof(psk));
    snprintf(c->job.team, sizeof(c->job.team), "%s", rep->element[0]->str); /* never the job's */
    sodium_bin2hex(mac_hex, sizeof(mac_hex), c->job.auth.mac, 16);
    snprintf(here, sizeof(here), "%" PRId32 ":%" PRId64, c->call.ticket.partition,
             c->call.ticket.offset);
    if (sf_redis_cmd(c->ctx->redis, on_seen, op, "SET " SF_RK_PRODUCER_SEEN " %s NX GET PX %d",
                     c->job.auth.key, mac_hex, here,
                     SF_JOBAUTH_WINDOW_MS + SF_JOBAUTH_SKEW_MS) < 0)
        verdict(op, SCH_AUTH_DOWN, NULL);
}

void sch_auth_job(sch_call *c, sch_auth_cb cb)
{
    const sf_job_auth *a = &c->job.auth;
    int64_t now = sf_now_ms();
    size_t klen = strlen(a->key);
    auth_op *op = malloc(sizeof(*op));
    char text[512];

    if (!op) {
        cb(c, SCH_AUTH_DOWN, NULL);
        return;
    }
    op->c = c;
    op->cb = cb;
    if (a->state == 0) {
        if (c->ctx->cfg.accept_unsigned) {
            verdict(op, SCH_AUTH_OK, NULL);
            return;
        }
        verdict(op, SCH_AUTH_REFUSED, "The job is not signed; put it on sf.jobs with the sf-key, sf-iat and sf-mac "
                  "headers schemas/envelope.md describes.");
        return;
    }
    if (a->state < 0) {
        snprintf(text, sizeof(text), "The job's signature cannot be read: %s; sign it as "
                 "schemas/envelope.md says.", a->why);
        verdict(op, SCH_AUTH_REFUSED, text);
        return;
    }
    if (!strcmp(a->key, SF_JOBAUTH_GATEWAY)) {
        if (sf_jobauth_check(a, c->ctx->gateway_key) < 0) {
            verdict(op, SCH_AUTH_REFUSED, "The job claims to come from a gateway but its HMAC does not match the "
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
            verdict(op, SCH_AUTH_REFUSED, text);
            return;
        }
        verdict(op, SCH_AUTH_OK, NULL);
        return;
    }
    if (!producer_id_valid(a->key)) {
        verdict(op, SCH_AUTH_REFUSED, "The job's sf-key is not a producer id ('p' and 20 hex characters, derived "
                  "from the API key as schemas/envelope.md says).");
        return;
    }
    if (strncmp(c->job.id, a->key, klen) != 0 || c->job.id[klen] != '-') {
        snprintf(text, sizeof(text), "A signed job's id must start with its producer id and "
                 "'-' (%s-...); rename the job.", a->key);
        verdict(op, SCH_AUTH_REFUSED, text);
        return;
    }
    if (a->iat < now - SF_JOBAUTH_WINDOW_MS) {
        snprintf(text, sizeof(text), "The job expired: it was signed %lld s ago and signed jobs "
                 "are taken for %d s; sign it again.", (long long)((now - a->iat) / 1000),
                 SF_JOBAUTH_WINDOW_MS / 1000);
        verdict(op, SCH_AUTH_REFUSED, text);
        return;
    }
    if (a->iat > now + SF_JOBAUTH_SKEW_MS) {
        verdict(op, SCH_AUTH_REFUSED, "The job was signed more than 60 s in the future; fix the producer's clock.");
        return;
    }
    if (sf_redis_cmd(c->ctx->redis, on_producer, op, "HMGET " SF_RK_PRODUCER " team psk",
                     a->key) < 0)
        verdict(op, SCH_AUTH_DOWN, NULL);
}
