/* auth.c: bearer API keys (keyed BLAKE2b hashes in Redis) and MCP sessions.
 *
 * Hot path: a key verified in the last key_cache_ms and a session this gateway knows are
 * answered from memory, with no Redis round trip. A revoked key or a deleted session is
 * announced on the Redis channel SF_CH_GATEWAY ("key:<hash>", "sess:<id>") and dropped
 * from every gateway's memory at once; when the subscription (re)connects, both caches
 * are emptied, since announcements may have been missed.
 *
 * Sessions never strand a client: a session id this team presents that Redis no longer
 * knows (expired, evicted, lost) is recreated on the spot (the tools keep no per-session
 * state); only a session of another team, or one the client deleted (kept as a tombstone
 * for the session lifetime), gets 404. A team over max_sessions_team evicts its least
 * recently used sessions when it opens a new one. */
#include "gateway.h"
#include "oauth.h"
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
#define SESS_CACHE_MAX 262144
#define TOUCH_EVERY_MS 30000 /* a used session's TTL and LRU rank are refreshed this often */

/* Bumped (process-wide) whenever a session is deleted here: a session cached by any
 * thread before the bump is checked against Redis again, so a DELETE answered on one
 * thread is seen at once by the others (other processes learn it over pub/sub). */
static unsigned long sess_gen;

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
    cache_clear(&ctx->sess_cache, SESS_CACHE_MAX);
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

static gw_session *sess_cache_put(gw_ctx *ctx, const char *sid, const char *team,
                                  const char *protocol, int level)
{
    gw_session *s;

    if (!ctx->sess_cache)
        return NULL;
    if (!(s = sf_map_get(ctx->sess_cache, sid))) {
        if (sf_map_len(ctx->sess_cache) >= SESS_CACHE_MAX)
            cache_clear(&ctx->sess_cache, SESS_CACHE_MAX);
        if (!ctx->sess_cache || !(s = calloc(1, sizeof(*s))))
            return NULL;
        if (sf_map_put(ctx->sess_cache, sid, s) < 0) {
            free(s);
            return NULL;
        }
    }
    snprintf(s->id, sizeof(s->id), "%s", sid);
    snprintf(s->team, sizeof(s->team), "%s", team);
    snprintf(s->protocol, sizeof(s->protocol), "%s", protocol);
    s->level = level;
    s->gen = __atomic_load_n(&sess_gen, __ATOMIC_ACQUIRE);
    return s;
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
    } else if (!strncmp(msg, "sess:", 5) && ctx->sess_cache) {
        free(sf_map_del(ctx->sess_cache, msg + 5));
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
    if (ctx->sess_cache)
        sf_map_foreach(ctx->sess_cache, free_entry, NULL);
    sf_map_free(ctx->key_cache);
    sf_map_free(ctx->sess_cache);
    ctx->key_cache = ctx->sess_cache = NULL;
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
    int sess_found, sess_deleted, sess_level;
    char hash[SF_APIKEY_HASH_HEX];
    char team[SF_ID_MAX];
    char session_team[SF_ID_MAX];
    char session_protocol[16];
    char session_id[SF_ID_MAX];
    char want_protocol[16];
    int is_token;     /* an OAuth access token, not an API key (never cached) */
    char why[200];    /* the 401's sentence */
} auth_op;

#define WHY_BAD_KEY "The API key is not valid: it is mistyped, or it was revoked."
#define WHY_NOT_A_KEY "That is neither a sandfleet API key (sf_live_...) nor an access token."

/* The session's TTL and its rank in the team's LRU set, at most every TOUCH_EVERY_MS. */
static void session_touch(gw_ctx *ctx, gw_session *s, int force)
{
    int64_t now = sf_mono_ms(), ttl = ctx->cfg.session_ttl_s;

    if (!force && now - s->touched_ms < TOUCH_EVERY_MS)
        return;
    s->touched_ms = now;
    sf_redis_cmd(ctx->redis, NULL, NULL, "EXPIRE " SF_RK_SESSION " %lld", s->id, (long long)ttl);
    sf_redis_cmd(ctx->redis, NULL, NULL, "ZADD " SF_RK_TEAM_SESSIONS " %lld %s", s->team,
                 (long long)sf_now_ms(), s->id);
    sf_redis_cmd(ctx->redis, NULL, NULL, "PEXPIRE " SF_RK_TEAM_SESSIONS " %lld", s->team,
                 (long long)ttl * 1000);
}

static const char *valid_protocol(const char *p)
{
    static const char *const versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                           "2024-11-05"};
    for (size_t i = 0; p && i < SF_ARRAY_LEN(versions); i++)
        if (!strcmp(p, versions[i]))
            return versions[i];
    return versions[0];
}

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
    if (op->status == 200 && op->has_session) {
        if (op->sess_found && strcmp(op->team, op->session_team) != 0) {
            op->status = 404; /* another team's session */
        } else if (op->sess_found && op->sess_deleted) {
            op->status = 404; /* deleted by its client: a tombstone */
        } else if (op->sess_found) {
            s = sess_cache_put(ctx, op->session_id, op->team, op->session_protocol,
                               op->sess_level);
            if (s)
                session_touch(ctx, s, 1);
        } else {
            /* Unknown here (expired, evicted): recreate it for this team. */
            const char *proto = valid_protocol(op->want_protocol[0] ? op->want_protocol : NULL);
            char now[24];

            snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
            sf_redis_cmd(ctx->redis, NULL, NULL,
                         "HSET " SF_RK_SESSION " team %s protocol %s created %s recreated 1",
                         op->session_id, op->team, proto, now);
            s = sess_cache_put(ctx, op->session_id, op->team, proto, GW_LOG_LEVEL_DEFAULT);
            if (s)
                session_touch(ctx, s, 1);
            sf_info("msg=\"session recreated\" session=%s team=%s", op->session_id, op->team);
        }
        if (op->status == 200 && !s)
            op->status = 503;
    }
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
    redisReply *rep = r;

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 4) {
        if (op->status == 200)
            op->status = 503;
    } else if (rep->element[0]->type == REDIS_REPLY_STRING) {
        op->sess_found = 1;
        copy_str(rep->element[0], op->session_team, sizeof(op->session_team));
        copy_str(rep->element[1], op->session_protocol, sizeof(op->session_protocol));
        op->sess_deleted = rep->element[2]->type == REDIS_REPLY_STRING;
        op->sess_level = GW_LOG_LEVEL_DEFAULT;
        if (rep->element[3]->type == REDIS_REPLY_STRING)
            op->sess_level = gw_log_level_parse(rep->element[3]->str);
        if (op->sess_level < 0)
            op->sess_level = GW_LOG_LEVEL_DEFAULT;
    }
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
    if (session_id && sf_redis_cmd(ctx->redis, on_session, op,
                                   "HMGET " SF_RK_SESSION " team protocol deleted level",
                                   session_id) < 0) {
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
        gw_session *s = session_id ? sf_map_get(ctx->sess_cache, session_id) : NULL;
        if (s && s->gen != __atomic_load_n(&sess_gen, __ATOMIC_ACQUIRE))
            s = NULL; /* a session was deleted since: ask Redis */
        if (!session_id) {
            cb(arg, 200, team, NULL, NULL);
            return;
        }
        if (s) {
            if (strcmp(s->team, team) != 0) {
                cb(arg, 404, NULL, NULL, NULL);
                return;
            }
            session_touch(ctx, s, 0);
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
        if (sf_redis_cmd(ctx->redis, on_session, op,
                         "HMGET " SF_RK_SESSION " team protocol deleted level", session_id) < 0)
            op->status = 503;
        else
            op->waiting++;
    }
}

/* ------------------------------------------------------------------ create, delete, level */

/* A new session is two single-slot steps (state/sf_store.c): the session's hash
 * (sess_put; refused whole when Redis is full: 507), then the team's sessions zset
 * (sess_team), which answers the least recently used sessions beyond the team's limit;
 * each of those is deleted (its own slot). */
typedef struct session_op {
    gw_ctx *ctx;
    gw_session_cb cb;
    void *arg;
    char sid[SF_ID_MAX];
    char team[SF_ID_MAX];
    char protocol[16];
    char now[24], ttl[24];
} session_op;

static void session_answer(session_op *op, int ok, const redisReply *rep)
{
    gw_session *s = NULL;

    if (ok && (s = sess_cache_put(op->ctx, op->sid, op->team, op->protocol,
                                  GW_LOG_LEVEL_DEFAULT)))
        s->touched_ms = sf_mono_ms();
    op->cb(op->arg, s ? 200 : sf_redis_is_oom(rep) ? 507 : 503, s ? op->sid : NULL);
    free(op);
}

static void on_session_team(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    session_op *op = priv;
    size_t n = 0;

    if (rep && rep->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < rep->elements; i++)
            if (rep->element[i]->type == REDIS_REPLY_STRING && sf_id_valid(rep->element[i]->str) &&
                sf_redis_cmd(op->ctx->redis, NULL, NULL, "DEL " SF_RK_SESSION,
                             rep->element[i]->str) == 0)
                n++;
        if (n)
            sf_info("msg=\"sessions evicted (least recently used)\" team=%s n=%zu", op->team, n);
    }
    session_answer(op, rep && rep->type == REDIS_REPLY_ARRAY, rep);
}

static void on_session_created(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    session_op *op = priv;
    char key[128], limit[24];
    const char *argv[] = {key, op->sid, op->now, op->ttl, limit};
    size_t lens[SF_ARRAY_LEN(argv)];

    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        session_answer(op, 0, rep);
        return;
    }
    snprintf(key, sizeof(key), SF_RK_TEAM_SESSIONS, op->team);
    snprintf(limit, sizeof(limit), "%lld", (long long)op->ctx->cfg.max_sessions_team);
    for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(op->ctx->redis, &sf_store_sess_team, on_session_team, op, 1, 4,
                             argv, lens) < 0)
        session_answer(op, 0, NULL);
}

void gw_session_create(gw_ctx *ctx, const char *team, const char *protocol, gw_session_cb cb,
                       void *arg)
{
    session_op *op = calloc(1, sizeof(*op));
    char key[128];

    if (!op || sf_id_new(op->sid, "mcp_") < 0) {
        free(op);
        cb(arg, 503, NULL);
        return;
    }
    op->ctx = ctx;
    op->cb = cb;
    op->arg = arg;
    snprintf(op->team, sizeof(op->team), "%s", team);
    snprintf(op->protocol, sizeof(op->protocol), "%s", protocol);
    snprintf(op->now, sizeof(op->now), "%lld", (long long)sf_now_ms());
    snprintf(op->ttl, sizeof(op->ttl), "%lld", (long long)ctx->cfg.session_ttl_s);
    snprintf(key, sizeof(key), SF_RK_SESSION, op->sid);
    {
        const char *argv[] = {key, op->team, op->protocol, op->now, op->ttl};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        if (sf_redis_script_call(ctx->redis, &sf_store_sess_put, on_session_created, op, 1, 4,
                                 argv, lens) < 0) {
            free(op);
            cb(arg, 503, NULL);
        }
    }
}

typedef struct delete_op {
    void (*cb)(void *arg, int ok);
    void *arg;
} delete_op;

static void on_deleted(redisAsyncContext *ac, void *r, void *priv)
{
    delete_op *op = priv;
    redisReply *rep = r;

    __atomic_fetch_add(&sess_gen, 1, __ATOMIC_RELEASE); /* after the tombstone is written */
    /* 1 written, 0 Redis unreachable, -1 Redis full (the tombstone was refused) */
    op->cb(op->arg, rep && rep->type == REDIS_REPLY_INTEGER ? 1 : sf_redis_is_oom(rep) ? -1 : 0);
    free(op);
}

/* The client ended it: a tombstone for the session lifetime, announced to every gateway;
 * cb runs once the tombstone is written. */
void gw_session_delete(gw_ctx *ctx, const char *team, const char *sid,
                       void (*cb)(void *arg, int ok), void *arg)
{
    delete_op *op;

    if (!sf_id_valid(sid) || !(op = calloc(1, sizeof(*op)))) {
        cb(arg, 0);
        return;
    }
    op->cb = cb;
    op->arg = arg;
    free(sf_map_del(ctx->sess_cache, sid));
    if (sf_redis_cmd(ctx->redis, on_deleted, op, "HSET " SF_RK_SESSION " team %s deleted 1", sid,
                     team) < 0) {
        free(op);
        cb(arg, 0);
        return;
    }
    sf_redis_cmd(ctx->redis, NULL, NULL, "EXPIRE " SF_RK_SESSION " %lld", sid,
                 (long long)ctx->cfg.session_ttl_s);
    sf_redis_cmd(ctx->redis, NULL, NULL, "ZREM " SF_RK_TEAM_SESSIONS " %s", team, sid);
    sf_redis_cmd(ctx->redis, NULL, NULL, "PUBLISH " SF_CH_GATEWAY " sess:%s", sid);
}

typedef struct level_op {
    void (*cb)(void *arg, int ok);
    void *arg;
    char sid[SF_ID_MAX];
} level_op;

static void on_level_set(redisAsyncContext *ac, void *r, void *priv)
{
    level_op *op = priv;
    redisReply *rep = r;
    int ok = rep && rep->type == REDIS_REPLY_INTEGER ? 1 : sf_redis_is_oom(rep) ? -1 : 0;

    if (ok < 0)
        sf_warn("msg=\"session log level not kept: Redis is full\" session=%s", op->sid);
    op->cb(op->arg, ok);
    free(op);
}

void gw_session_set_level(gw_ctx *ctx, gw_session *s, int level, void (*cb)(void *arg, int ok),
                          void *arg)
{
    level_op *op = calloc(1, sizeof(*op));

    if (!op) {
        cb(arg, 0);
        return;
    }
    op->cb = cb;
    op->arg = arg;
    snprintf(op->sid, sizeof(op->sid), "%s", s->id);
    s->level = level;
    if (sf_redis_cmd(ctx->redis, on_level_set, op, "HSET " SF_RK_SESSION " level %s", s->id,
                     gw_log_level_name(level)) < 0) {
        free(op);
        cb(arg, 0);
        return;
    }
    /* the other gateways (and threads) read it again from Redis */
    sf_redis_cmd(ctx->redis, NULL, NULL, "PUBLISH " SF_CH_GATEWAY " sess:%s", s->id);
}
