/* idem.c: idempotency keys (idem.h). */
#include "idem.h"
#include "sf_claim.h"
#include "sf_log.h"
#include "sf_store.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(SF_CLAIM_TTL_MS == 300 * 1000, "idem_gone says 5 minutes");
static const char idem_gone[] =
    "This call already ran (same idempotency key), but its answer was large and large "
    "answers are kept only 5 minutes, so it is gone. Check the sandbox's state, then call "
    "again with a new idempotency key if needed.";

int gw_idem_derive(const char *team, const json_t *key, sf_job *job, char *rkey, size_t n,
                   const char **why)
{
    const char *k = json_string_value(key);
    unsigned char h[16];
    char hex[33];
    size_t len = k ? strlen(k) : 0;
    crypto_generichash_state st;

    for (size_t i = 0; i < len; i++)
        if ((unsigned char)k[i] < 0x20 || k[i] == 0x7f)
            len = 0;
    if (len == 0 || len > 128) {
        *why = "_meta[\"" GW_META_IDEMPOTENCY_KEY "\"] must be a string of 1 to 128 printable "
               "characters (e.g. a UUID); fix it and retry.";
        return -EINVAL;
    }
    /* team-scoped: the same key from two teams names two calls */
    crypto_generichash_init(&st, NULL, 0, sizeof(h));
    crypto_generichash_update(&st, (const unsigned char *)team, strlen(team) + 1);
    crypto_generichash_update(&st, (const unsigned char *)k, len);
    crypto_generichash_final(&st, h, sizeof(h));
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    snprintf(job->id, sizeof(job->id), "job_i%s", hex);
    if (!strcmp(job->tool, "sandbox_create"))
        snprintf(job->sandbox, sizeof(job->sandbox), "sb_i%.24s", hex);
    snprintf(rkey, n, SF_RK_IDEM, team, hex);
    return 0;
}

/* ------------------------------------------------------------------ lookup */

typedef struct idem_op {
    gw_idem_cb cb;
    void *arg;
} idem_op;

/* A retry's first answer, with its large values fetched again. */
static void on_fetched(void *arg, const sf_reply *r)
{
    idem_op *op = arg;

    op->cb(op->arg, 1, r);
    free(op);
}

typedef struct idem_get {
    gw_ctx *ctx;
    gw_idem_cb cb;
    void *arg;
    char team[SF_ID_MAX];
    char job[SF_ID_MAX];
} idem_get;

static void on_lookup(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    idem_get *g = priv;
    gw_idem_cb cb = g->cb;
    void *arg = g->arg;
    sf_reply rr;
    const char *why = NULL;

    if (rep && rep->type == REDIS_REPLY_STRING &&
        sf_reply_decode(rep->str, rep->len, &rr, &why) == 0) {
        sf_info("msg=\"idempotent retry answered with the first answer\" job=%s", g->job);
        if (rr.kind == SF_REPLY_RESULT && rr.claims.n > 0) { /* its large values */
            idem_op *op = malloc(sizeof(*op));
            if (!op) {
                sf_reply_fini(&rr);
                free(g);
                cb(arg, -EIO, NULL);
                return;
            }
            op->cb = cb;
            op->arg = arg;
            gw_jobs_fetch_claims(g->ctx, g->team, &rr, 1, idem_gone, on_fetched, op);
            free(g);
            return;
        }
        free(g);
        cb(arg, 1, &rr);
        sf_reply_fini(&rr);
        return;
    }
    free(g);
    cb(arg, !rep || rep->type == REDIS_REPLY_ERROR ? -EIO : 0, NULL);
}

void gw_idem_lookup(gw_ctx *ctx, const char *team, const char *rkey, const char *job,
                    gw_idem_cb cb, void *arg)
{
    idem_get *g = calloc(1, sizeof(*g));

    if (!g) {
        cb(arg, -EIO, NULL);
        return;
    }
    g->ctx = ctx;
    g->cb = cb;
    g->arg = arg;
    snprintf(g->team, sizeof(g->team), "%s", team);
    snprintf(g->job, sizeof(g->job), "%s", job);
    if (sf_redis_cmd(ctx->redis, on_lookup, g, "GET %s", rkey) < 0)
        on_lookup(NULL, NULL, g);
}

/* ------------------------------------------------------------------ store */

static void on_idem_stored(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;

    if (!rep || rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"cannot keep the answer under its idempotency key; a retry may run the "
                "call again\" err=\"%s\"", rep ? rep->str : "Redis connection lost");
}

/* An idempotent call's final answer is kept 24 h under its key, for retries. Its claimed
 * fields (large values: sf_claim.h) are kept as their claims' names only (empty); the claims were
 * read, not taken, and stay until their TTL (SF_CLAIM_TTL_MS). */
void gw_idem_store(gw_ctx *ctx, const char *rkey, const char *job, const sf_reply *r)
{
    sf_reply slim = *r;
    json_t *res = NULL;
    sf_buf b;

    if (r->kind == SF_REPLY_RESULT && r->claims.n > 0) {
        if (!(res = json_copy(r->result)))
            return;
        for (int i = 0; i < r->claims.n; i++) /* as the worker sends them: "" */
            json_object_set_new(res, r->claims.name[i], json_string(""));
        slim.result = res;
    }
    sf_buf_init(&b, SF_MSG_MAX);
    if (sf_reply_encode(&slim, &b) < 0) {
        sf_warn("msg=\"cannot keep the answer under its idempotency key; a retry may run the "
                "call again\" job=%s err=\"too large\"", job);
    } else {
        const char *argv[] = {"SET", rkey, b.p, "EX", "86400"};
        size_t lens[] = {3, strlen(rkey), b.len, 2, 5};
        if (sf_redis_cmdargv(ctx->redis, on_idem_stored, NULL, 5, argv, lens) < 0)
            sf_warn("msg=\"cannot keep the answer under its idempotency key; Redis is down\" "
                    "job=%s", job);
    }
    sf_buf_fini(&b);
    json_decref(res);
}
