/* auth.c: bearer credentials (API keys: keyed BLAKE2b hashes in Redis; OAuth access
 * tokens through oauth.c) and the check of a request's credentials and session together
 * (the session itself is session.c's).
 *
 * Hot path: a key verified in the last key_cache_ms and a session this gateway knows are
 * answered from memory, with no Redis round trip. A revoked key or a deleted session is
 * announced on the Redis channel SF_CH_GATEWAY ("key:<hash>", "sess:<id>") and dropped
 * from every gateway's memory at once; when the subscription (re)connects, both caches
 * are emptied, since announcements may have been missed. */
#include "gateway.h"
#include "oauth.h"
#include "session.h"
#include "sf_apikeys.h"
#include "sf_auth.h"
#include "sf_oauth.h"
#include "sf_log.h"
#include "sf_store.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KEY_CACHE_MAX  65536

/* Hashing a key (its checks, keyed BLAKE2b, hex) was 7% of a tools/list request's CPU time,
 * done twice per request (the head check, then the call). A memo per thread maps a key's
 * SipHash-128 tag, under a random secret of that thread, to its hash: no key is kept in
 * clear, and tags cannot be aimed at each other. A key's hash never changes, so the memo
 * needs no invalidation (revocation acts on the verified-key cache behind it). */
#define KEY_MEMO_SLOTS 64
struct gw_key_memo {
    uint8_t secret[crypto_shorthash_siphashx24_KEYBYTES];
    struct {
        uint8_t tag[crypto_shorthash_siphashx24_BYTES];
        char hash[SF_APIKEY_HASH_HEX]; /* "" empty slot */
    } slot[KEY_MEMO_SLOTS];
};

/* sf_apikey_hash through the memo. */
static int key_hash(gw_ctx *ctx, const char *key, char out[SF_APIKEY_HASH_HEX])
{
    struct gw_key_memo *m = ctx->key_memo;
    uint8_t tag[crypto_shorthash_siphashx24_BYTES];
    size_t i;
    int rc;

    if (!m || strlen(key) != SF_APIKEY_LEN)
        return sf_apikey_hash(ctx->auth_secret, key, out);
    crypto_shorthash_siphashx24(tag, (const unsigned char *)key, SF_APIKEY_LEN, m->secret);
    i = tag[0] % KEY_MEMO_SLOTS;
    if (m->slot[i].hash[0] && sodium_memcmp(m->slot[i].tag, tag, sizeof(tag)) == 0) {
        memcpy(out, m->slot[i].hash, SF_APIKEY_HASH_HEX);
        return 0;
    }
    if ((rc = sf_apikey_hash(ctx->auth_secret, key, out)) < 0)
        return rc;
    memcpy(m->slot[i].tag, tag, sizeof(tag));
    memcpy(m->slot[i].hash, out, SF_APIKEY_HASH_HEX);
    return 0;
}

typedef struct key_entry {
    char team[SF_ID_MAX];
    int64_t until_ms; /* monotonic */
} key_entry;

/* ------------------------------------------------------------------ caches */

static void free_entry(const char *key, void *val, void *arg)
{
    free(val);
}

static void cache_clear(sf_map **m, size_t max)
{
    if (*m)
        sf_map_foreach(*m, free_entry, NULL);
    sf_map_free(*m);
    *m = sf_map_new(max);
}

void gw_auth_caches_clear(gw_ctx *ctx)
{
    cache_clear(&ctx->key_cache, KEY_CACHE_MAX);
    gw_session_cache_clear(ctx);
}

static void key_cache_put(gw_ctx *ctx, const char *hash, const char *team)
{
    key_entry *e;

    if (ctx->cfg.key_cache_ms <= 0 || !ctx->key_cache)
        return;
    if (!(e = sf_map_get(ctx->key_cache, hash))) {
        if (sf_map_len(ctx->key_cache) >= KEY_CACHE_MAX)
            cache_clear(&ctx->key_cache, KEY_CACHE_MAX);
        if (!ctx->key_cache || !(e = calloc(1, sizeof(*e))))
            return;
        if (sf_map_put(ctx->key_cache, hash, e) < 0) {
            free(e);
            return;
        }
    }
    snprintf(e->team, sizeof(e->team), "%s", team);
    e->until_ms = sf_mono_ms() + ctx->cfg.key_cache_ms;
}

static const char *key_cache_get(gw_ctx *ctx, const char *hash)
{
    key_entry *e = ctx->key_cache ? sf_map_get(ctx->key_cache, hash) : NULL;

    if (!e)
        return NULL;
    if (e->until_ms < sf_mono_ms()) {
        free(sf_map_del(ctx->key_cache, hash));
        return NULL;
    }
    return e->team;
}

/* ------------------------------------------------------------------ announcements */

static void on_announce(redisAsyncContext *ac, void *r, void *priv)
{
    gw_ctx *ctx = priv;
    redisReply *rep = r;
    const char *msg;

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING || strcmp(rep->element[0]->str, "message") ||
        rep->element[2]->type != REDIS_REPLY_STRING)
        return;
    msg = rep->element[2]->str;
    if (!strncmp(msg, "key:", 4) && ctx->key_cache) {
        free(sf_map_del(ctx->key_cache, msg + 4));
        sf_info("msg=\"API key revoked: dropped from the cache\"");
    } else if (!strncmp(msg, "sess:", 5)) {
        gw_session_forget(ctx, msg + 5);
    }
}

static void on_sub_connect(void *arg)
{
    gw_ctx *ctx = arg;

    gw_auth_caches_clear(ctx); /* announcements may have been missed while away */
    if (sf_redis_cmd(ctx->redis_sub, on_announce, ctx, "SUBSCRIBE " SF_CH_GATEWAY) < 0)
        sf_warn("msg=\"cannot subscribe to the gateway channel\"");
}

int gw_auth_start(gw_ctx *ctx, char *why, size_t whylen)
{
    gw_auth_caches_clear(ctx);
    if (!ctx->key_cache || !ctx->sess_cache ||
        !(ctx->key_memo = calloc(1, sizeof(*ctx->key_memo)))) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    randombytes_buf(ctx->key_memo->secret, sizeof(ctx->key_memo->secret));
    if (!(ctx->redis_sub = sf_redis_new(ctx->d.base, ctx->cfg.common.redis_url, why, whylen)))
        return -1;
    sf_redis_on_connect(ctx->redis_sub, on_sub_connect, ctx);
    return 0;
}

void gw_auth_stop(gw_ctx *ctx)
{
    sf_redis_free(ctx->redis_sub);
    ctx->redis_sub = NULL;
    if (ctx->key_cache)
        sf_map_foreach(ctx->key_cache, free_entry, NULL);
    sf_map_free(ctx->key_cache);
    ctx->key_cache = NULL;
    gw_session_cache_free(ctx);
    free(ctx->key_memo);
    ctx->key_memo = NULL;
}

/* ------------------------------------------------------------------ checks */

typedef struct auth_op {
    gw_ctx *ctx;
    gw_auth_cb cb;
    void *arg;
    int waiting;      /* replies still to come */
    int status;
    int has_session;
    gw_session_rec rec; /* the session's record, as read */
    char hash[SF_APIKEY_HASH_HEX];
    char team[SF_ID_MAX];
    char session_id[SF_ID_MAX];
    char want_protocol[16];
    int is_token;     /* an OAuth access token, not an API key (never cached) */
    char why[200];    /* the 401's sentence */
} auth_op;

#define WHY_BAD_KEY "The API key is not valid: it is mistyped, or it was revoked."
#define WHY_NOT_A_KEY "That is neither a sandfleet API key (sf_live_...) nor an access token."

/* Answers from what we know: key team, and the session (cached or just read). */
static void auth_answer(gw_ctx *ctx, gw_auth_cb cb, void *arg, int status, const char *team,
                        gw_session *s, const char *why)
{
    cb(arg, status, status == 200 ? team : NULL, status == 200 ? s : NULL,
       status == 401 ? (why && *why ? why : WHY_BAD_KEY) : NULL);
}

static void auth_finish(auth_op *op)
{
    gw_ctx *ctx = op->ctx;
    gw_session *s = NULL;

    if (op->status == 200 && !op->is_token)
        key_cache_put(ctx, op->hash, op->team);
    if (op->status == 200 && op->has_session)
        op->status = gw_session_resolve(ctx, op->session_id, op->team, &op->rec,
                                        op->want_protocol[0] ? op->want_protocol : NULL, &s);
    auth_answer(ctx, op->cb, op->arg, op->status, op->team, s, op->why);
    free(op);
}

static void copy_str(redisReply *rep, char *dst, size_t n)
{
    if (rep && rep->type == REDIS_REPLY_STRING && rep->len < n) {
        memcpy(dst, rep->str, rep->len);
        dst[rep->len] = '\0';
    }
}

static void on_key(redisAsyncContext *ac, void *r, void *priv)
{
    auth_op *op = priv;
    redisReply *rep = r;

    if (!rep || rep->type == REDIS_REPLY_ERROR)
        op->status = 503;
    else if (rep->type != REDIS_REPLY_STRING || rep->len == 0 || rep->len >= sizeof(op->team))
        op->status = op->status == 503 ? 503 : 401; /* the key's verdict wins */
    else
        copy_str(rep, op->team, sizeof(op->team));
    if (--op->waiting == 0)
        auth_finish(op);
}

static void on_session(redisAsyncContext *ac, void *r, void *priv)
{
    auth_op *op = priv;

    if (gw_session_parse(r, &op->rec) < 0 && op->status == 200)
        op->status = 503;
    if (--op->waiting == 0)
        auth_finish(op);
}

static void on_token_checked(void *arg, int status, const char *team, const char *detail)
{
    auth_op *op = arg;

    if (status == 200)
        snprintf(op->team, sizeof(op->team), "%s", team);
    else if (status == 401 && op->status != 503)
        op->status = 401, snprintf(op->why, sizeof(op->why), "%s", detail ? detail : "");
    else
        op->status = 503;
    if (--op->waiting == 0)
        auth_finish(op);
}

static void auth_check_token(gw_ctx *ctx, const char *token, const char *session_id,
                             const char *protocol, const char *resource, gw_auth_cb cb,
                             void *arg)
{
    auth_op *op = calloc(1, sizeof(*op));

    if (!op) {
        cb(arg, 503, NULL, NULL, NULL);
        return;
    }
    op->ctx = ctx;
    op->cb = cb;
    op->arg = arg;
    op->status = 200;
    op->is_token = 1;
    op->has_session = session_id != NULL;
    if (protocol)
        snprintf(op->want_protocol, sizeof(op->want_protocol), "%s", protocol);
    if (session_id)
        snprintf(op->session_id, sizeof(op->session_id), "%s", session_id);
    op->waiting = 1 + (session_id != NULL);
    if (session_id && gw_session_fetch(ctx, session_id, on_session, op) < 0) {
        op->status = 503;
        op->waiting--;
    }
    gw_oauth_token_check(ctx, token, resource, on_token_checked, op);
}

void gw_auth_check(gw_ctx *ctx, const char *authorization, const char *session_id,
                   const char *protocol, const char *resource, gw_auth_cb cb, void *arg)
{
    char hash[SF_APIKEY_HASH_HEX];
    const char *team;
    auth_op *op;

    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0) {
        cb(arg, 401, NULL, NULL, NULL);
        return;
    }
    authorization += 7;
    while (*authorization == ' ')
        authorization++;
    if (session_id && !sf_id_valid(session_id)) {
        cb(arg, 404, NULL, NULL, NULL);
        return;
    }
    if (!strncmp(authorization, SF_OAUTH_AT_PREFIX, strlen(SF_OAUTH_AT_PREFIX))) {
        auth_check_token(ctx, authorization, session_id, protocol, resource, cb, arg);
        return;
    }
    if (key_hash(ctx, authorization, hash) < 0) {
        cb(arg, 401, NULL, NULL, WHY_NOT_A_KEY);
        return;
    }
    /* The hot path: both known here. */
    if ((team = key_cache_get(ctx, hash))) {
        gw_session *s = session_id ? gw_session_known(ctx, session_id) : NULL;
        if (!session_id) {
            cb(arg, 200, team, NULL, NULL);
            return;
        }
        if (s) {
            if (strcmp(s->team, team) != 0) {
                cb(arg, 404, NULL, NULL, NULL);
                return;
            }
            gw_session_touch(ctx, s, 0);
            cb(arg, 200, team, s, NULL);
            return;
        }
    }
    if (!(op = calloc(1, sizeof(*op)))) {
        cb(arg, 503, NULL, NULL, NULL);
        return;
    }
    op->ctx = ctx;
    op->cb = cb;
    op->arg = arg;
    op->status = 200;
    op->has_session = session_id != NULL;
    memcpy(op->hash, hash, sizeof(hash));
    if (protocol)
        snprintf(op->want_protocol, sizeof(op->want_protocol), "%s", protocol);
    if (session_id)
        snprintf(op->session_id, sizeof(op->session_id), "%s", session_id);
    if (sf_apikeys_team(ctx->redis, hash, on_key, op) < 0) {
        free(op);
        cb(arg, 503, NULL, NULL, NULL);
        return;
    }
    op->waiting = 1;
    if (session_id) {
        if (gw_session_fetch(ctx, session_id, on_session, op) < 0)
            op->status = 503;
        else
            op->waiting++;
    }
}

