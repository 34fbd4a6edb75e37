/* oauth.c: the OAuth 2.1 authorization server and the resource side of it (see oauth.h).
 *
 * Flow: a client without a token gets 401 + WWW-Authenticate resource_metadata; it reads
 * /.well-known/oauth-protected-resource[/mcp] and /.well-known/oauth-authorization-server,
 * registers (POST /oauth/register), sends the person to GET /oauth/authorize (PKCE S256,
 * resource = this MCP endpoint), where the sign-in page takes a team API key; POST
 * /oauth/authorize (CSRF: a one-time token in a SameSite=Strict cookie and the form, bound
 * to the request stored in Redis) redirects back with a one-minute, single-use code;
 * POST /oauth/token trades it (and later refresh tokens, rotated) for tokens.
 *
 * Redis holds only keyed hashes of codes and tokens (sf_oauth.h). A grant (one sign-in)
 * owns its current access and refresh token; it ends when it is revoked, when its API key
 * is revoked (checked on every use), or when a used code or a rotated refresh token comes
 * back (a stolen copy: the whole grant is revoked). */
#include "oauth.h"
#include "sf_apikeys.h"
#include "sf_auth.h"
#include "sf_log.h"
#include "sf_oauth.h"
#include "sf_store.h"
#include "sf_msg.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_PARAMS 24
#define REG_BODY_MAX 65536
#define FORM_BODY_MAX 16384
#define MAX_REDIRECTS 10
#define URI_MAX GW_OAUTH_URI_MAX
#define STATE_MAX 1024
#define NAME_MAX_LEN 200
#define CLIENT_TTL_S (90 * 86400)  /* a used registration unused this long is forgotten */
#define CLIENT_NEW_TTL_S 86400     /* a registration nobody signed in with: a day */
#define REQ_TTL_S 600              /* a sign-in page is good for 10 minutes */
#define CODE_TTL_S 60
#define SCOPE "mcp"
#define COOKIE "sf_oauth_csrf"

/* ------------------------------------------------------------------ small helpers */

typedef struct params {
    size_t n;
    char *name[MAX_PARAMS];
    char *value[MAX_PARAMS];
    char *buf;
} params;

static int hexval(int c)
{
    return isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1;
}

/* application/x-www-form-urlencoded (a query string or a form body). -EINVAL: malformed,
 * too many, or a parameter given twice (RFC 6749 3.1). */
static int params_parse(params *p, const char *s, size_t len)
{
    char *o;

    memset(p, 0, sizeof(*p));
    if (!(p->buf = o = malloc(len + 1)))
        return -ENOMEM;
    for (size_t i = 0; i <= len;) {
        char *start = o;
        char *eq = NULL;
        while (i < len && s[i] != '&') {
            int c = (unsigned char)s[i];
            if (c == '+') {
                c = ' ';
            } else if (c == '%') {
                int h = i + 2 < len ? hexval((unsigned char)s[i + 1]) : -1;
                int l = i + 2 < len ? hexval((unsigned char)s[i + 2]) : -1;
                if (h < 0 || l < 0)
                    return -EINVAL;
                c = h * 16 + l;
                i += 2;
                if (c == 0)
                    return -EINVAL;
            } else if (c == '=' && !eq) {
                *o++ = '\0';
                eq = o;
                i++;
                continue;
            }
            *o++ = (char)c;
            i++;
        }
        *o++ = '\0';
        i++;
        if (o - start <= 1)
            continue; /* an empty piece ("a=1&&b=2") */
        if (p->n >= MAX_PARAMS)
            return -EINVAL;
        for (size_t k = 0; k < p->n; k++)
            if (!strcmp(p->name[k], start))
                return -EINVAL;
        p->name[p->n] = start;
        p->value[p->n++] = eq ? eq : o - 1;
    }
    return 0;
}

static void params_free(params *p)
{
    free(p->buf);
    p->buf = NULL;
}

static const char *param(const params *p, const char *name)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->name[i], name))
            return p->value[i][0] ? p->value[i] : NULL;
    return NULL;
}

static void urlenc(sf_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
            sf_buf_append(b, s, 1);
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            sf_buf_append(b, e, 3);
        }
    }
}

/* Constant time, for secrets. */
static int same_secret(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la && i < lb; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* Metadata, registration, token and revocation answers may be read by browser-based
 * clients (CORS): they carry no cookie-based authority, so any origin may read them. */
static void json_answer(gw_req *req, int status, json_t *body)
{
    static const char *const h[] = {"Cache-Control", "no-store", "Pragma", "no-cache",
                                    "Access-Control-Allow-Origin", "*", NULL};
    char *text = body && req ? json_dumps(body, JSON_COMPACT) : NULL;

    if (!req) {
        json_decref(body);
        return;
    }
    gw_req_respond(req, status, "application/json", h, text ? text : "{}",
                   text ? strlen(text) : 2);
    free(text);
    json_decref(body);
}

/* 429 with Retry-After (seconds) and an OAuth error body. */
static void json_429(gw_req *req, long retry_s, const char *description)
{
    char ra[24], *text;
    json_t *body = json_pack("{s:s, s:s}", "error", "temporarily_unavailable",
                             "error_description", description);
    const char *h[] = {"Cache-Control", "no-store", "Access-Control-Allow-Origin", "*",
                       "Access-Control-Expose-Headers", "Retry-After", "Retry-After", ra, NULL};

    snprintf(ra, sizeof(ra), "%ld", retry_s);
    text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    gw_req_respond(req, 429, "application/json", h, text ? text : "{}", text ? strlen(text) : 2);
    free(text);
    json_decref(body);
}

/* An OAuth error answer (RFC 6749 5.2): {error, error_description}. */
static void oauth_error(gw_req *req, int status, const char *error, const char *description)
{
    json_answer(req, status, json_pack("{s:s, s:s}", "error", error, "error_description",
                                       description));
}

static void html(gw_req *req, int status, char *page, const char *cookie)
{
    if (!req) {
        free(page);
        return;
    }
    if (!page) {
        gw_req_respond(req, 503, "text/plain", NULL, "out of memory", 13);
        return;
    }
    gw_req_respond(req, status, "text/html; charset=utf-8", gw_oauth_page_headers(cookie), page,
                   strlen(page));
    free(page);
}

static void error_page(gw_req *req, int status, const char *title, const char *sentence)
{
    html(req, status, gw_oauth_error_page(title, sentence), NULL);
}

/* A 429 page with Retry-After (seconds). */
static void page_429(gw_req *req, long retry_s, const char *sentence)
{
    const char *const *ph = gw_oauth_page_headers(NULL);
    const char *h[20];
    char ra[24], *page = gw_oauth_error_page("Too many sign-ins", sentence);
    size_t i = 0;

    snprintf(ra, sizeof(ra), "%ld", retry_s);
    while (ph[i] && i + 3 < SF_ARRAY_LEN(h)) {
        h[i] = ph[i];
        i++;
    }
    h[i++] = "Retry-After";
    h[i++] = ra;
    h[i] = NULL;
    if (!page) {
        gw_req_respond(req, 503, "text/plain", NULL, "out of memory", 13);
        return;
    }
    gw_req_respond(req, 429, "text/html; charset=utf-8", h, page, strlen(page));
    free(page);
}

/* ------------------------------------------------------------------ where we are */

static int is_tls(gw_req *req)
{
    const char *p = gw_req_protocol(req);
    return !strcmp(p, "h2") || strstr(p, "+tls") != NULL;
}

/* A Host header we are willing to echo into metadata: a name or address and a port. */
static int host_ok(const char *h)
{
    size_t n = h ? strlen(h) : 0;
    return n > 0 && n < 200 &&
           strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]") == n;
}

void gw_oauth_base(gw_ctx *ctx, gw_req *req, char *out, size_t n)
{
    const char *pub = ctx->cfg.public_url, *host = gw_req_header(req, "Host");
    size_t len;

    if (pub && *pub) {
        snprintf(out, n, "%s", pub);
    } else {
        snprintf(out, n, "%s://%s", is_tls(req) ? "https" : "http",
                 host_ok(host) ? host : "localhost");
    }
    len = strlen(out);
    while (len > 0 && out[len - 1] == '/')
        out[--len] = '\0';
}

void gw_oauth_resource(gw_ctx *ctx, gw_req *req, char *out, size_t n)
{
    char base[256];

    gw_oauth_base(ctx, req, base, sizeof(base));
    snprintf(out, n, "%s/mcp", base);
}

void gw_oauth_challenge(gw_ctx *ctx, gw_req *req, const char *why, char *out, size_t n)
{
    char base[256], desc[400];
    size_t o = 0;

    gw_oauth_base(ctx, req, base, sizeof(base));
    if (why) { /* a quoted-string: no quotes or backslashes inside */
        for (const char *s = why; *s && o + 1 < sizeof(desc); s++)
            desc[o++] = (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20) ? '\'' : *s;
        desc[o] = '\0';
        snprintf(out, n, "Bearer error=\"invalid_token\", error_description=\"%s\", "
                         "resource_metadata=\"%s/.well-known/oauth-protected-resource/mcp\"",
                 desc, base);
    } else {
        snprintf(out, n, "Bearer resource_metadata=\"%s/.well-known/oauth-protected-resource/mcp\"",
                 base);
    }
}

void gw_oauth_challenge_fn(gw_req *req, const char *msg, char *out, size_t n, void *arg)
{
    gw_oauth_challenge(arg, req, gw_req_header(req, "Authorization") ? msg : NULL, out, n);
}

/* ------------------------------------------------------------------ metadata */

static void resource_metadata(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    char base[256], resource[300];

    gw_oauth_base(ctx, req, base, sizeof(base));
    gw_oauth_resource(ctx, req, resource, sizeof(resource));
    json_answer(req, 200, json_pack("{s:s, s:[s], s:[s], s:[s], s:s}", "resource", resource,
                                    "authorization_servers", base, "bearer_methods_supported",
                                    "header", "scopes_supported", SCOPE, "resource_name",
                                    "sandfleet"));
}

static void server_metadata(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    char base[256], a[300], t[300], r[300], v[300];

    gw_oauth_base(ctx, req, base, sizeof(base));
    snprintf(a, sizeof(a), "%s/oauth/authorize", base);
    snprintf(t, sizeof(t), "%s/oauth/token", base);
    snprintf(r, sizeof(r), "%s/oauth/register", base);
    snprintf(v, sizeof(v), "%s/oauth/revoke", base);
    json_answer(req, 200,
                json_pack("{s:s, s:s, s:s, s:s, s:s, s:[s], s:[s, s], s:[s], s:[s], s:[s], "
                          "s:[s], s:b}",
                          "issuer", base, "authorization_endpoint", a, "token_endpoint", t,
                          "registration_endpoint", r, "revocation_endpoint", v,
                          "response_types_supported", "code", "grant_types_supported",
                          "authorization_code", "refresh_token", "code_challenge_methods_supported",
                          "S256", "token_endpoint_auth_methods_supported", "none",
                          "revocation_endpoint_auth_methods_supported", "none",
                          "scopes_supported", SCOPE, "client_id_metadata_document_supported", 1));
}

/* ------------------------------------------------------------------ requests in flight */

typedef struct op {
    gw_ctx *ctx;
    gw_req *req;        /* NULL once the client left */
    params p;
    json_t *rec;        /* the record read from Redis */
    char base[256];
    char resource[300];
    char csrf_hash[SF_OAUTH_HASH_HEX];
    char code_hash[SF_OAUTH_HASH_HEX];
    char grant[SF_ID_MAX];
    char team[SF_ID_MAX];
    char key_hash[SF_APIKEY_HASH_HEX];
    char redirect[URI_MAX + 1];
    char page_hash[SF_OAUTH_HASH_HEX]; /* the sign-in page being stored */
    int pending;        /* Redis replies still to come before the answer */
    int status;
    char *text;         /* the record to store once admitted (oauth_admit) */
} op;

static void op_abort(gw_req *req, void *arg)
{
    ((op *)arg)->req = NULL; /* the Redis callbacks finish alone */
}

static op *op_new(gw_ctx *ctx, gw_req *req)
{
    op *o = calloc(1, sizeof(*o));

    if (!o) {
        gw_req_respond(req, 503, "text/plain", NULL, "out of memory", 13);
        return NULL;
    }
    o->ctx = ctx;
    o->req = req;
    gw_oauth_base(ctx, req, o->base, sizeof(o->base));
    gw_oauth_resource(ctx, req, o->resource, sizeof(o->resource));
    gw_req_set_abort_cb(req, op_abort, o);
    return o;
}

static void op_free(op *o)
{
    if (o->req)
        gw_req_set_abort_cb(o->req, NULL, NULL);
    params_free(&o->p);
    json_decref(o->rec);
    free(o->text);
    free(o);
}

/* The request answered (or gone): forget it. */
static gw_req *op_take(op *o)
{
    gw_req *r = o->req;
    if (r)
        gw_req_set_abort_cb(r, NULL, NULL);
    o->req = NULL;
    return r;
}

static json_t *reply_json(redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_STRING ? json_loadb(rep->str, rep->len, 0, NULL) : NULL;
}

static const char *jstr(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static int redis_down(op *o, redisReply *rep)
{
    if (rep && rep->type != REDIS_REPLY_ERROR)
        return 0;
    if (o->req)
        oauth_error(op_take(o), 503, "temporarily_unavailable",
                    SF_MSG_STORE_DOWN);
    return 1;
}

/* ------------------------------------------------------------------ bounded writes */

/* What unauthenticated clients write is bounded (the oauth_admit script): a registration
 * and a sign-in page each count against their source address's minute and against the
 * most alive at once; refused ones write nothing and answer 429 with Retry-After. */

static void on_ignored(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac, (void)r, (void)priv;
}

/* The source address as the limits count it: IPv4 as it is, IPv6 by its /64 (one host
 * may hold a whole /64). */
static void addr_bucket(gw_req *req, char *out, size_t n)
{
    const char *p = req ? gw_req_peer(req) : "unknown";
    struct in6_addr a6;
    char t[INET6_ADDRSTRLEN];

    if (strchr(p, ':') && inet_pton(AF_INET6, p, &a6) == 1 && !IN6_IS_ADDR_V4MAPPED(&a6)) {
        memset(a6.s6_addr + 8, 0, 8);
        if (inet_ntop(AF_INET6, &a6, t, sizeof(t))) {
            snprintf(out, n, "%s/64", t);
            return;
        }
    }
    snprintf(out, n, "%.*s", (int)strcspn(p, "{}"), p);
}

/* Asks for one more entry: addr_key counts o's address, live_key (a zset) the entries
 * alive, member is the new one (ttl_ms). cb gets the script's reply (admit_verdict). */
static int admit(op *o, const char *addr_key, const char *live_key, int64_t per_min,
                 int64_t max, int64_t ttl_ms, const char *member, redisCallbackFn *cb)
{
    char pm[24], mx[24], now[24], ttl[24];
    const char *argv[7] = {addr_key, live_key, pm, mx, now, ttl, member};
    size_t lens[7];

    snprintf(pm, sizeof(pm), "%lld", (long long)per_min);
    snprintf(mx, sizeof(mx), "%lld", (long long)max);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    return sf_redis_script_call(o->ctx->redis, &sf_store_oauth_admit, cb, o, 2, 5, argv, lens);
}

/* 1 admitted; 0 refused (*retry_s, *full: the most alive, not the address's minute); -1
 * Redis down or full. */
static int admit_verdict(const redisReply *rep, long *retry_s, int *full)
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    if (!strcmp(rep->element[0]->str, "ok"))
        return 1;
    *retry_s = (long)rep->element[1]->integer;
    *full = !strcmp(rep->element[0]->str, "full");
    return 0;
}

/* An entry of the live zset live_key no longer counts (used, or consumed). */
static void admit_release(gw_ctx *ctx, const char *live_key, const char *member)
{
    const char *argv[2] = {live_key, member};
    size_t lens[2] = {strlen(live_key), strlen(member)};

    sf_redis_script_call(ctx->redis, &sf_store_oauth_used, on_ignored, NULL, 1, 1, argv, lens);
}

static void addr_key(op *o, const char *fmt_is_page, char *out, size_t n)
{
    char addr[INET6_ADDRSTRLEN + 8];

    addr_bucket(o->req, addr, sizeof(addr));
    if (fmt_is_page)
        snprintf(out, n, SF_RK_OAUTH_PAGE_ADDR, addr);
    else
        snprintf(out, n, SF_RK_OAUTH_REG_ADDR, addr);
}

/* ------------------------------------------------------------------ registration */

static void on_registered(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;

    if (!redis_down(o, r) && o->req) {
        json_t *out = json_deep_copy(o->rec);
        json_object_del(out, "created");
        json_answer(op_take(o), 201, out);
    }
    op_free(o);
}

/* Admitted (a registration is stored for CLIENT_NEW_TTL_S; a sign-in with it keeps it
 * CLIENT_TTL_S), or refused with 429. */
static void on_register_admitted(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    long retry = 60;
    int full = 0, v = admit_verdict(r, &retry, &full);
    char msg[300];

    if (!o->req) {
        op_free(o);
        return;
    }
    if (v < 0) {
        if (sf_redis_is_oom(r))
            oauth_error(op_take(o), 503, "temporarily_unavailable", SF_MSG_PLATFORM_FULL);
        else
            redis_down(o, NULL);
        op_free(o);
        return;
    }
    if (v == 0) {
        if (full)
            snprintf(msg, sizeof(msg), "This server holds as many new application registrations "
                     "as it allows (oauth_clients_max); reuse a registration you have, or retry "
                     "in %ld seconds.", retry);
        else
            snprintf(msg, sizeof(msg), "Too many applications were registered from this address "
                     "in the last minute (oauth_register_per_min); retry in %ld seconds.", retry);
        sf_warn("msg=\"OAuth registration refused\" peer=%s why=%s", gw_req_peer(o->req),
                full ? "oauth_clients_max" : "oauth_register_per_min");
        json_429(op_take(o), retry, msg);
        op_free(o);
        return;
    }
    if (sf_redis_cmd(o->ctx->redis, on_registered, o, "SET " SF_RK_OAUTH_CLIENT " %s EX %d",
                     o->grant, o->text, CLIENT_NEW_TTL_S) < 0) {
        redis_down(o, NULL);
        op_free(o);
    }
}

static void reg_error(gw_req *req, const char *why)
{
    oauth_error(req, 400, "invalid_client_metadata", why);
}

static void do_register(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    size_t len, i;
    const char *body = gw_req_body(req, &len), *why = NULL, *name, *auth;
    json_t *meta, *uris, *u, *grants, *types, *rec;
    char id[SF_ID_MAX], key[200], *text;
    op *o;

    if (len > REG_BODY_MAX || !(meta = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL)) ||
        !json_is_object(meta)) {
        reg_error(req, "Send the client metadata as one JSON object (at most 64 KiB).");
        return;
    }
    uris = json_object_get(meta, "redirect_uris");
    if (!json_is_array(uris) || json_array_size(uris) == 0 || json_array_size(uris) > MAX_REDIRECTS) {
        json_decref(meta);
        reg_error(req, "redirect_uris must list 1 to 10 redirect URIs.");
        return;
    }
    json_array_foreach(uris, i, u)
        if (!json_is_string(u) || !gw_oauth_redirect_uri_ok(json_string_value(u), &why)) {
            char msg[200];
            snprintf(msg, sizeof(msg), "Refused redirect URI: %s.", why ? why : "not a string");
            json_decref(meta);
            reg_error(req, msg);
            return;
        }
    auth = jstr(meta, "token_endpoint_auth_method");
    if (auth && strcmp(auth, "none") != 0) {
        json_decref(meta);
        reg_error(req, "Only public clients are supported: token_endpoint_auth_method must be "
                       "\"none\" (PKCE protects the code).");
        return;
    }
    grants = json_object_get(meta, "grant_types");
    json_array_foreach(grants, i, u)
        if (!json_is_string(u) || (strcmp(json_string_value(u), "authorization_code") &&
                                   strcmp(json_string_value(u), "refresh_token"))) {
            json_decref(meta);
            reg_error(req, "grant_types may hold only authorization_code and refresh_token.");
            return;
        }
    types = json_object_get(meta, "response_types");
    json_array_foreach(types, i, u)
        if (!json_is_string(u) || strcmp(json_string_value(u), "code")) {
            json_decref(meta);
            reg_error(req, "response_types may hold only code.");
            return;
        }
    name = jstr(meta, "client_name");
    if (name && strlen(name) > NAME_MAX_LEN) {
        json_decref(meta);
        reg_error(req, "client_name is too long (at most 200 characters).");
        return;
    }
    sf_id_new(id, "sfc_");
    rec = json_pack("{s:s, s:i, s:s, s:O, s:[s, s], s:[s], s:s, s:I}", "client_id", id,
                    "client_id_issued_at", (int)(sf_now_ms() / 1000), "client_name",
                    name ? name : "An unnamed application", "redirect_uris", uris,
                    "grant_types", "authorization_code", "refresh_token", "response_types",
                    "code", "token_endpoint_auth_method", "none", "created",
                    (json_int_t)sf_now_ms());
    json_decref(meta);
    text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    if (!text || !(o = op_new(ctx, req))) {
        free(text);
        json_decref(rec);
        if (!text)
            gw_req_respond(req, 503, "text/plain", NULL, "out of memory", 13);
        return;
    }
    o->rec = rec;
    o->text = text;
    snprintf(o->grant, sizeof(o->grant), "%s", id); /* (the new client's id) */
    addr_key(o, NULL, key, sizeof(key));
    if (admit(o, key, SF_RK_OAUTH_REG_UNUSED, ctx->cfg.oauth_register_per_min,
              ctx->cfg.oauth_clients_max, (int64_t)CLIENT_NEW_TTL_S * 1000, id,
              on_register_admitted) < 0) {
        redis_down(o, NULL);
        op_free(o);
    }
}

/* ------------------------------------------------------------------ authorize */

/* Sends the person back to the client with `error` (after the redirect URI is known good). */
static void redirect_error(gw_req *req, const char *redirect, const char *state, const char *base,
                           const char *error, const char *description)
{
    sf_buf b;
    const char *h[3] = {"Location", NULL, NULL};

    sf_buf_init(&b, 8192);
    sf_buf_appendf(&b, "%s%serror=%s&error_description=", redirect,
                   strchr(redirect, '?') ? "&" : "?", error);
    urlenc(&b, description);
    if (state) {
        sf_buf_appendf(&b, "&state=");
        urlenc(&b, state);
    }
    sf_buf_appendf(&b, "&iss=");
    urlenc(&b, base);
    h[1] = b.p ? b.p : redirect;
    gw_req_respond(req, 302, NULL, h, NULL, 0);
    sf_buf_fini(&b);
}

/* Shows the sign-in page for the request stored under a new CSRF token. */
static void show_page(op *o, json_t *areq, const char *error);

static void on_page_stored(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    char cookie[200];
    const char *csrf = jstr(o->rec, "csrf");

    if (!redis_down(o, r) && o->req) {
        snprintf(cookie, sizeof(cookie), COOKIE "=%s; Path=/oauth; HttpOnly; SameSite=Strict%s",
                 csrf, !strncmp(o->base, "https:", 6) ? "; Secure" : "");
        html(op_take(o), jstr(o->rec, "error") ? 400 : 200,
             gw_oauth_page(jstr(o->rec, "client_name"), jstr(o->rec, "redirect_host"), csrf,
                           jstr(o->rec, "error")),
             cookie);
    }
    op_free(o);
}

/* The sign-in page may be kept (or 429: too many from this address, or alive). */
static void on_page_admitted(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    long retry = 60;
    int full = 0, v = admit_verdict(r, &retry, &full);
    char msg[300];

    if (!o->req) {
        op_free(o);
        return;
    }
    if (v != 1) {
        if (v == 0)
            snprintf(msg, sizeof(msg), "%s; retry in %ld seconds.",
                     full ? "This server has as many sign-ins in progress as it allows "
                            "(oauth_signins_max)"
                          : "Too many sign-ins were started from this address in the last "
                            "minute (oauth_signin_per_min)", retry);
        if (v == 0)
            page_429(op_take(o), retry, msg);
        else
            error_page(op_take(o), 503, "Try again", sf_redis_is_oom(r) ? SF_MSG_PLATFORM_FULL
                       : SF_MSG_STORE_DOWN);
        op_free(o);
        return;
    }
    if (sf_redis_cmd(o->ctx->redis, on_page_stored, o, "SET " SF_RK_OAUTH_REQ " %s EX %d",
                     o->page_hash, o->text, REQ_TTL_S) < 0) {
        error_page(op_take(o), 503, "Try again", SF_MSG_STORE_DOWN);
        op_free(o);
    }
}

static void show_page(op *o, json_t *areq, const char *error)
{
    char csrf[SF_OAUTH_SECRET_MAX], hash[SF_OAUTH_HASH_HEX], host[256], key[200];
    const char *ru = jstr(areq, "redirect_uri"), *p = strstr(ru, "://");
    char *text;

    /* the page names where the person goes back to: the redirect URI's host */
    snprintf(host, sizeof(host), "%.*s", p ? (int)strcspn(p + 3, "/?#") : (int)strcspn(ru, ":"),
             p ? p + 3 : ru);
    if (sf_oauth_secret_new("", csrf) < 0 || sf_oauth_hash(o->ctx->auth_secret, csrf, hash) < 0 ||
        !(text = json_dumps(areq, JSON_COMPACT))) {
        error_page(op_take(o), 503, "Try again", "The server could not start the sign-in; retry.");
        op_free(o);
        return;
    }
    json_decref(o->rec);
    o->rec = json_pack("{s:s, s:s, s:s, s:s?}", "csrf", csrf, "client_name",
                       jstr(areq, "client_name"), "redirect_host", host, "error", error);
    free(o->text);
    o->text = text;
    memcpy(o->page_hash, hash, sizeof(o->page_hash));
    addr_key(o, "page", key, sizeof(key));
    if (!o->rec || !o->req ||
        admit(o, key, SF_RK_OAUTH_PAGES, o->ctx->cfg.oauth_signin_per_min,
              o->ctx->cfg.oauth_signins_max, (int64_t)REQ_TTL_S * 1000, hash,
              on_page_admitted) < 0) {
        error_page(op_take(o), 503, "Try again", SF_MSG_STORE_DOWN);
        op_free(o);
    }
}

/* The client (a registration, or a metadata document) is known: check the request against
 * it and show the sign-in page. client NULL: unknown. */
static void authorize_with(op *o, json_t *client)
{
    json_t *uris, *u, *areq;
    const char *ru = param(&o->p, "redirect_uri"), *state = param(&o->p, "state"), *match = NULL;
    const char *rt = param(&o->p, "response_type"), *cc = param(&o->p, "code_challenge");
    const char *ccm = param(&o->p, "code_challenge_method"), *res = param(&o->p, "resource");
    const char *why;
    size_t i;

    if (!client) {
        error_page(op_take(o), 400, "Unknown application",
                   "This application is not registered with this sandfleet (or its registration "
                   "expired). Start the connection again from the application.");
        goto done;
    }
    uris = json_object_get(client, "redirect_uris");
    json_array_foreach(uris, i, u)
        if (ru && json_is_string(u) && gw_oauth_redirect_matches(json_string_value(u), ru))
            match = ru; /* the requested one: a loopback redirect may name its port */
        else if (!ru && json_array_size(uris) == 1)
            match = json_string_value(u);
    if (!match) { /* never redirect to an unchecked URI: say it here */
        error_page(op_take(o), 400, "Wrong redirect address",
                   "The application asked to come back to an address it did not register. "
                   "Nothing was granted; tell the application's maker.");
        goto done;
    }
    if (!gw_oauth_redirect_uri_ok(match, &why)) { /* registered before the rules were strict */
        error_page(op_take(o), 400, "Unsafe redirect address",
                   "The application registered an address to come back to that is not safe "
                   "(not https, or not a plain host); nothing was granted: the application "
                   "must register again with a correct redirect URI.");
        goto done;
    }
    snprintf(o->redirect, sizeof(o->redirect), "%s", match);
    if (!rt || strcmp(rt, "code") != 0) {
        redirect_error(op_take(o), match, state, o->base, "unsupported_response_type",
                       "Only response_type=code is supported.");
    } else if (!cc || !ccm || strcmp(ccm, "S256") != 0 || strlen(cc) != 43) {
        redirect_error(op_take(o), match, state, o->base, "invalid_request",
                       "PKCE is required: send code_challenge with code_challenge_method=S256.");
    } else if (res && strcmp(res, o->resource) != 0) {
        redirect_error(op_take(o), match, state, o->base, "invalid_target",
                       "The resource must be this server's MCP endpoint.");
    } else if (state && strlen(state) > STATE_MAX) {
        redirect_error(op_take(o), match, NULL, o->base, "invalid_request", "state is too long.");
    } else {
        areq = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s?}", "client_id", jstr(client, "client_id"),
                         "client_name", jstr(client, "client_name") ?: "An application",
                         "redirect_uri", match, "code_challenge", cc, "resource", o->resource,
                         "state", state);
        if (areq) {
            show_page(o, areq, NULL); /* show_page owns o now */
            json_decref(areq);
            return;
        }
        error_page(op_take(o), 503, "Try again", "Out of memory; retry.");
    }
done:
    op_free(o);
}

static void on_client_for_authorize(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    json_t *client;

    if (!o->req || !r || ((redisReply *)r)->type == REDIS_REPLY_ERROR) {
        if (o->req)
            error_page(op_take(o), 503, "Try again", SF_MSG_STORE_DOWN);
        op_free(o);
        return;
    }
    client = reply_json(r);
    authorize_with(o, client);
    json_decref(client);
}

/* A client ID metadata document arrived (or did not). */
static void on_client_document(void *arg, json_t *client, const char *why)
{
    op *o = arg;

    if (!o->req) {
        op_free(o);
        return;
    }
    if (!client) {
        error_page(op_take(o), 400, "This application cannot sign in",
                   why ? why : "Its client metadata document could not be used.");
        op_free(o);
        return;
    }
    authorize_with(o, client);
}

static void authorize_get(gw_req *req, gw_ctx *ctx)
{
    const char *q = gw_req_query(req), *client_id;
    op *o = op_new(ctx, req);

    if (!o)
        return;
    if (params_parse(&o->p, q, strlen(q)) < 0) {
        error_page(op_take(o), 400, "Malformed request",
                   "The sign-in address is malformed (a parameter repeated or badly encoded). "
                   "Start the connection again from the application.");
        op_free(o);
        return;
    }
    client_id = param(&o->p, "client_id");
    if (gw_cimd_is_url(client_id)) { /* a client ID metadata document */
        gw_cimd_get(ctx, client_id, on_client_document, o);
        return;
    }
    if (!client_id || !sf_id_valid(client_id)) {
        error_page(op_take(o), 400, "Unknown application",
                   "The sign-in address names no registered application (client_id). Start the "
                   "connection again from the application.");
        op_free(o);
        return;
    }
    if (sf_redis_cmd(ctx->redis, on_client_for_authorize, o, "GET " SF_RK_OAUTH_CLIENT,
                     client_id) < 0)
        on_client_for_authorize(NULL, NULL, o);
}

/* The form posted: approve (with an API key) or deny. */
static void on_code_stored(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    json_t *areq = o->rec;

    if (!redis_down(o, r) && o->req) {
        const char *h[3] = {"Location", NULL, NULL};
        sf_buf b;

        sf_buf_init(&b, 8192);
        sf_buf_appendf(&b, "%s%scode=", jstr(areq, "redirect_uri"),
                       strchr(jstr(areq, "redirect_uri"), '?') ? "&" : "?");
        urlenc(&b, jstr(areq, "code"));
        if (jstr(areq, "state")) {
            sf_buf_appendf(&b, "&state=");
            urlenc(&b, jstr(areq, "state"));
        }
        sf_buf_appendf(&b, "&iss=");
        urlenc(&b, o->base);
        h[1] = b.p;
        if (b.p)
            gw_req_respond(op_take(o), 302, NULL, h, NULL, 0);
        else
            error_page(op_take(o), 503, "Try again", "Out of memory; retry.");
        sf_buf_fini(&b);
        sf_info("msg=\"OAuth sign-in approved\" team=%s client=%s", o->team,
                jstr(areq, "client_id"));
    }
    op_free(o);
}

static void on_key_for_approve(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    redisReply *rep = r;
    json_t *areq = o->rec;
    char code[SF_OAUTH_SECRET_MAX], hash[SF_OAUTH_HASH_HEX], *text;
    json_t *rec;

    if (!o->req || redis_down(o, rep)) {
        op_free(o);
        return;
    }
    if (rep->type != REDIS_REPLY_STRING || rep->len == 0 || rep->len >= sizeof(o->team)) {
        o->rec = NULL;
        show_page(o, areq, "That API key is not valid: it is mistyped, or it was revoked. Check "
                           "it and try again.");
        json_decref(areq);
        return;
    }
    memcpy(o->team, rep->str, rep->len);
    o->team[rep->len] = '\0';
    if (sf_id_valid(jstr(areq, "client_id") ?: "")) { /* used: it keeps the longer life */
        sf_redis_cmd(o->ctx->redis, NULL, NULL, "EXPIRE " SF_RK_OAUTH_CLIENT " %d",
                     jstr(areq, "client_id"), CLIENT_TTL_S);
        admit_release(o->ctx, SF_RK_OAUTH_REG_UNUSED, jstr(areq, "client_id"));
    }
    if (sf_oauth_secret_new(SF_OAUTH_CODE_PREFIX, code) < 0 ||
        sf_oauth_hash(o->ctx->auth_secret, code, hash) < 0) {
        error_page(op_take(o), 503, "Try again", "The server could not make a code; retry.");
        op_free(o);
        return;
    }
    rec = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "client_id", jstr(areq, "client_id"),
                    "client_name", jstr(areq, "client_name"), "redirect_uri",
                    jstr(areq, "redirect_uri"), "code_challenge", jstr(areq, "code_challenge"),
                    "resource", jstr(areq, "resource"), "team", o->team, "key", o->key_hash);
    text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    json_object_set_new(areq, "code", json_string(code));
    if (!text || sf_redis_cmd(o->ctx->redis, on_code_stored, o, "SET " SF_RK_OAUTH_CODE " %s EX %d",
                              hash, text, CODE_TTL_S) < 0) {
        error_page(op_take(o), 503, "Try again", SF_MSG_STORE_DOWN);
        op_free(o);
    }
    free(text);
}

static void on_request_for_post(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    json_t *areq = reply_json(r);
    const char *decision = param(&o->p, "decision"), *key = param(&o->p, "api_key");

    if (!o->req || redis_down(o, r)) {
        json_decref(areq);
        op_free(o);
        return;
    }
    if (!areq) {
        error_page(op_take(o), 400, "This sign-in expired",
                   "The sign-in page was used already or is over 10 minutes old. Start the "
                   "connection again from the application.");
        op_free(o);
        return;
    }
    if (!decision || strcmp(decision, "approve") != 0) {
        redirect_error(op_take(o), jstr(areq, "redirect_uri"), jstr(areq, "state"), o->base,
                       "access_denied", "The person declined the access.");
        sf_info("msg=\"OAuth sign-in denied\" client=%s", jstr(areq, "client_id"));
        json_decref(areq);
        op_free(o);
        return;
    }
    if (!key || sf_apikey_hash(o->ctx->auth_secret, key, o->key_hash) < 0) {
        show_page(o, areq, "That is not a sandfleet API key: it starts with sf_live_. Check it "
                           "and try again.");
        json_decref(areq);
        return;
    }
    o->rec = areq;
    if (sf_apikeys_team(o->ctx->redis, o->key_hash, on_key_for_approve, o) < 0)
        on_key_for_approve(NULL, NULL, o);
}

/* The value of cookie `name` in the Cookie header, or NULL. */
static const char *cookie_value(gw_req *req, const char *name, char *out, size_t n)
{
    const char *c = gw_req_header(req, "Cookie");
    size_t nl = strlen(name);

    while (c && *c) {
        while (*c == ' ' || *c == ';')
            c++;
        if (!strncmp(c, name, nl) && c[nl] == '=') {
            size_t vl = strcspn(c + nl + 1, ";");
            if (vl >= n)
                return NULL;
            memcpy(out, c + nl + 1, vl);
            out[vl] = '\0';
            return out;
        }
        c = strchr(c, ';');
    }
    return NULL;
}

static void authorize_post(gw_req *req, gw_ctx *ctx)
{
    size_t len;
    const char *body = gw_req_body(req, &len), *csrf;
    char cookie[SF_OAUTH_SECRET_MAX];
    op *o;

    if (len > FORM_BODY_MAX) {
        error_page(req, 413, "Too large", "The form is too large.");
        return;
    }
    if (!(o = op_new(ctx, req)))
        return;
    if (params_parse(&o->p, body, len) < 0) {
        error_page(op_take(o), 400, "Malformed form", "The form arrived malformed; start again "
                                                      "from the application.");
        op_free(o);
        return;
    }
    csrf = param(&o->p, "csrf");
    /* the form's token must match the cookie set with the page (SameSite=Strict): a post
     * from another site carries neither, or not both */
    if (!csrf || !cookie_value(req, COOKIE, cookie, sizeof(cookie)) || !same_secret(csrf, cookie) ||
        sf_oauth_hash(ctx->auth_secret, csrf, o->csrf_hash) < 0) {
        error_page(op_take(o), 403, "Refused",
                   "This form did not come from the sign-in page (its security token is missing "
                   "or wrong). Start the connection again from the application.");
        op_free(o);
        return;
    }
    if (sf_redis_cmd(ctx->redis, on_request_for_post, o, "GETDEL " SF_RK_OAUTH_REQ,
                     o->csrf_hash) < 0) {
        on_request_for_post(NULL, NULL, o);
        return;
    }
    admit_release(ctx, SF_RK_OAUTH_PAGES, o->csrf_hash);
}

static void do_authorize(gw_req *req, void *arg)
{
    if (!strcmp(gw_req_method(req), "POST"))
        authorize_post(req, arg);
    else
        authorize_get(req, arg);
}

/* ------------------------------------------------------------------ tokens */

static void on_tokens_stored(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;

    if (--o->pending > 0)
        return;
    if (o->req && o->status == 200)
        json_answer(op_take(o), 200, json_incref(o->rec));
    else if (o->req)
        oauth_error(op_take(o), 503, "temporarily_unavailable",
                    SF_MSG_STORE_DOWN);
    op_free(o);
}

static void on_store_reply(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    redisReply *rep = r;

    if (!rep || rep->type == REDIS_REPLY_ERROR)
        o->status = 503;
    on_tokens_stored(ac, r, priv);
}

/* Issues a new access + refresh token pair for the grant in o->rec (team, key, client_id,
 * client_name, resource, grant) and answers the token request. */
static void issue(op *o, const char *old_rt_hash)
{
    gw_ctx *ctx = o->ctx;
    json_t *g = o->rec;
    char at[SF_OAUTH_SECRET_MAX], rt[SF_OAUTH_SECRET_MAX], ath[SF_OAUTH_HASH_HEX],
        rth[SF_OAUTH_HASH_HEX], now[24];
    char *text;
    int64_t ttl = ctx->cfg.oauth_access_ttl_s, rttl = ctx->cfg.oauth_refresh_ttl_s;

    if (sf_oauth_secret_new(SF_OAUTH_AT_PREFIX, at) < 0 || sf_oauth_secret_new(SF_OAUTH_RT_PREFIX, rt) < 0 ||
        sf_oauth_hash(ctx->auth_secret, at, ath) < 0 || sf_oauth_hash(ctx->auth_secret, rt, rth) < 0) {
        oauth_error(op_take(o), 503, "temporarily_unavailable", "The server could not make a "
                                                                "token; retry.");
        op_free(o);
        return;
    }
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    json_object_set_new(g, "exp", json_integer(sf_now_ms() + ttl * 1000));
    text = json_dumps(g, JSON_COMPACT);
    o->rec = json_pack("{s:s, s:s, s:I, s:s, s:s}", "access_token", at, "token_type", "Bearer",
                       "expires_in", (json_int_t)ttl, "refresh_token", rt, "scope", SCOPE);
    o->status = text && o->rec ? 200 : 503;
    o->pending = 0;
    /* one connection, in order: the answer goes out after the last of these is applied.
     * Expired access tokens stay an hour more, so that their 401 can say "expired". */
    if (sf_redis_cmd(ctx->redis, on_store_reply, o, "SET " SF_RK_OAUTH_AT " %s EX %lld", ath,
                     text ? text : "{}", (long long)(ttl + 3600)) == 0)
        o->pending++;
    if (sf_redis_cmd(ctx->redis, on_store_reply, o, "SET " SF_RK_OAUTH_RT " %s EX %lld", rth,
                     text ? text : "{}", (long long)rttl) == 0)
        o->pending++;
    if (old_rt_hash)
        sf_redis_cmd(ctx->redis, NULL, NULL, "SET " SF_RK_OAUTH_RTOLD " %s EX %lld", old_rt_hash,
                     o->grant, (long long)rttl);
    if (sf_redis_cmd(ctx->redis, on_store_reply, o,
                     "HSET " SF_RK_OAUTH_GRANT " id %s team %s client %s client_name %s key %s "
                     "at %s rt %s used %s",
                     o->grant, o->grant, jstr(g, "team"), jstr(g, "client_id"), jstr(g, "client_name"),
                     jstr(g, "key"), ath, rth, now) == 0)
        o->pending++;
    if (sf_redis_cmd(ctx->redis, on_store_reply, o, "EXPIRE " SF_RK_OAUTH_GRANT " %lld", o->grant,
                     (long long)rttl) == 0)
        o->pending++;
    free(text);
    json_decref(g);
    if (o->pending == 0) { /* Redis is down: nothing will call back */
        o->pending = 1;
        o->status = 503;
        on_tokens_stored(NULL, NULL, o);
    }
}

/* Deletes grant id's tokens and record (revocation, or a stolen code/refresh token). When
 * o is given, its answer waits until the deletions are applied (a PING behind them on the
 * same connection), so a client never sees the revoked token work after the answer. */
static void on_revoked(redisAsyncContext *ac, void *r, void *priv);

typedef struct revoke_op {
    gw_ctx *ctx;
    op *o; /* NULL: nobody waits */
} revoke_op;

static void on_grant_for_revoke(redisAsyncContext *ac, void *r, void *priv)
{
    revoke_op *rv = priv;
    gw_ctx *ctx = rv->ctx;
    redisReply *rep = r;

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
        on_revoked(ac, NULL, rv);
        return;
    }
    if (rep->element[0]->type == REDIS_REPLY_STRING) {
        sf_redis_cmd(ctx->redis, NULL, NULL, "DEL " SF_RK_OAUTH_AT, rep->element[0]->str);
        sf_redis_cmd(ctx->redis, NULL, NULL, "PUBLISH " SF_CH_GATEWAY " key:%s",
                     rep->element[0]->str);
    }
    if (rep->element[1]->type == REDIS_REPLY_STRING)
        sf_redis_cmd(ctx->redis, NULL, NULL, "DEL " SF_RK_OAUTH_RT, rep->element[1]->str);
    if (rep->element[2]->type == REDIS_REPLY_STRING)
        sf_redis_cmd(ctx->redis, NULL, NULL, "DEL " SF_RK_OAUTH_GRANT, rep->element[2]->str);
    if (sf_redis_cmd(ctx->redis, on_revoked, rv, "PING") < 0)
        on_revoked(ac, NULL, rv);
}

static void answer_revoked(op *o);

static void on_revoked(redisAsyncContext *ac, void *r, void *priv)
{
    revoke_op *rv = priv;

    if (rv->o)
        answer_revoked(rv->o);
    free(rv);
}

/* o (or NULL) is answered by answer_revoked() once the grant is gone. */
static void revoke_grant_then(gw_ctx *ctx, const char *grant, op *o)
{
    revoke_op *rv = calloc(1, sizeof(*rv));

    if (!rv || !grant || !sf_id_valid(grant) ||
        sf_redis_cmd(ctx->redis, on_grant_for_revoke, rv, "HMGET " SF_RK_OAUTH_GRANT " at rt id",
                     grant) < 0) {
        free(rv);
        if (o)
            answer_revoked(o);
        return;
    }
    rv->ctx = ctx;
    rv->o = o;
}


/* The answer of a token or revocation request that revoked a grant. */
static void answer_revoked(op *o)
{
    if (o->req && o->status == 401)
        oauth_error(op_take(o), 400, "invalid_grant",
                    "The API key this access was granted with has been revoked; sign in again.");
    else if (o->req && o->status == 200)
        json_answer(op_take(o), 200, json_object()); /* /oauth/revoke: always 200 */
    else if (o->req)
        oauth_error(op_take(o), 400, "invalid_grant",
                    "The authorization code or refresh token is unknown, expired or already "
                    "used; sign in again.");
    op_free(o);
}

static void on_reuse_lookup(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    redisReply *rep = r;

    o->status = 400;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        sf_warn("msg=\"OAuth code or refresh token used twice: grant revoked\" grant=%s", rep->str);
        revoke_grant_then(o->ctx, rep->str, o);
        return;
    }
    answer_revoked(o);
}

static void on_key_alive(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    redisReply *rep = r;

    if (!o->req || redis_down(o, rep)) {
        op_free(o);
        return;
    }
    if (rep->type != REDIS_REPLY_INTEGER || rep->integer != 1) {
        o->status = 401;
        revoke_grant_then(o->ctx, o->grant, o);
        return;
    }
    issue(o, o->code_hash[0] ? o->code_hash : NULL);
}

/* A code or refresh token record came back (GETDEL): check it against the request. */
static void on_grant_source(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    json_t *g = reply_json(r);
    const char *grant_type = param(&o->p, "grant_type"), *cid = param(&o->p, "client_id");
    const char *res = param(&o->p, "resource");
    int is_code = !strcmp(grant_type, "authorization_code");

    if (!o->req || redis_down(o, r)) {
        json_decref(g);
        op_free(o);
        return;
    }
    if (!g) { /* unknown, expired, or used already: a second use revokes what the first got */
        if (sf_redis_cmd(o->ctx->redis, on_reuse_lookup, o,
                         is_code ? "GETDEL " SF_RK_OAUTH_USEDCODE : "GET " SF_RK_OAUTH_RTOLD,
                         o->csrf_hash) < 0)
            on_reuse_lookup(NULL, NULL, o);
        return;
    }
    if (!cid || strcmp(cid, jstr(g, "client_id") ?: "") != 0) {
        oauth_error(op_take(o), 400, "invalid_grant", "This code or token was issued to another "
                                                      "client.");
        goto done;
    }
    if (res && strcmp(res, jstr(g, "resource") ?: "") != 0) {
        oauth_error(op_take(o), 400, "invalid_target", "The resource does not match the one the "
                                                       "access was granted for.");
        goto done;
    }
    if (is_code) {
        char s256[44];
        const char *ru = param(&o->p, "redirect_uri");
        if (!ru || strcmp(ru, jstr(g, "redirect_uri") ?: "") != 0) {
            oauth_error(op_take(o), 400, "invalid_grant", "redirect_uri must be the one of the "
                                                          "authorization request.");
            goto done;
        }
        if (sf_oauth_s256(param(&o->p, "code_verifier"), s256) < 0 ||
            !same_secret(s256, jstr(g, "code_challenge") ?: "")) {
            oauth_error(op_take(o), 400, "invalid_grant", "PKCE verification failed: the "
                                                          "code_verifier does not match the "
                                                          "code_challenge.");
            goto done;
        }
        sf_id_new(o->grant, "grt_");
        json_object_del(g, "code_challenge");
        json_object_del(g, "redirect_uri");
        json_object_set_new(g, "grant", json_string(o->grant));
        /* remember the code for a while: a second use revokes this grant */
        sf_redis_cmd(o->ctx->redis, NULL, NULL, "SET " SF_RK_OAUTH_USEDCODE " %s EX %d",
                     o->csrf_hash, o->grant, 600);
        o->code_hash[0] = '\0';
    } else {
        snprintf(o->grant, sizeof(o->grant), "%s", jstr(g, "grant") ?: "");
        memcpy(o->code_hash, o->csrf_hash, sizeof(o->code_hash)); /* the rotated refresh token */
    }
    o->rec = g;
    g = NULL;
    if (sf_apikeys_exists(o->ctx->redis, jstr(o->rec, "key") ?: "-", on_key_alive, o) < 0)
        on_key_alive(NULL, NULL, o);
    return;
done:
    json_decref(g);
    op_free(o);
}

static void do_token(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    size_t len;
    const char *body = gw_req_body(req, &len), *gt, *secret;
    op *o;

    if (strcmp(gw_req_method(req), "POST") != 0) {
        oauth_error(req, 405, "invalid_request", "POST the token request.");
        return;
    }
    if (len > FORM_BODY_MAX || !(o = op_new(ctx, req))) {
        if (len > FORM_BODY_MAX)
            oauth_error(req, 413, "invalid_request", "The token request is too large.");
        return;
    }
    if (params_parse(&o->p, body, len) < 0) {
        oauth_error(op_take(o), 400, "invalid_request", "Send the token request as "
                                                        "application/x-www-form-urlencoded, each "
                                                        "parameter once.");
        op_free(o);
        return;
    }
    gt = param(&o->p, "grant_type");
    if (!gt || (strcmp(gt, "authorization_code") && strcmp(gt, "refresh_token"))) {
        oauth_error(op_take(o), 400, "unsupported_grant_type",
                    "grant_type must be authorization_code or refresh_token.");
        op_free(o);
        return;
    }
    secret = param(&o->p, !strcmp(gt, "authorization_code") ? "code" : "refresh_token");
    if (!secret || sf_oauth_hash(ctx->auth_secret, secret, o->csrf_hash) < 0) {
        oauth_error(op_take(o), 400, "invalid_request",
                    !strcmp(gt, "authorization_code") ? "code is required." : "refresh_token is "
                                                                               "required.");
        op_free(o);
        return;
    }
    if (sf_redis_cmd(ctx->redis, on_grant_source, o,
                     !strcmp(gt, "authorization_code") ? "GETDEL " SF_RK_OAUTH_CODE
                                                       : "GETDEL " SF_RK_OAUTH_RT,
                     o->csrf_hash) < 0)
        on_grant_source(NULL, NULL, o);
}

/* ------------------------------------------------------------------ revocation (RFC 7009) */

static void on_revoke_lookup(redisAsyncContext *ac, void *r, void *priv)
{
    op *o = priv;
    json_t *g = reply_json(r);

    if (g)
        snprintf(o->grant, sizeof(o->grant), "%s", jstr(g, "grant") ?: "");
    json_decref(g);
    if (--o->pending == 0) {
        o->status = 200;
        revoke_grant_then(o->ctx, o->grant[0] ? o->grant : NULL, o); /* answered when gone */
    }
}

static void do_revoke(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    size_t len;
    const char *body = gw_req_body(req, &len), *token;
    op *o;

    if (len > FORM_BODY_MAX || !(o = op_new(ctx, req))) {
        if (len > FORM_BODY_MAX)
            oauth_error(req, 413, "invalid_request", "The revocation request is too large.");
        return;
    }
    if (params_parse(&o->p, body, len) < 0 || !(token = param(&o->p, "token")) ||
        sf_oauth_hash(ctx->auth_secret, token, o->csrf_hash) < 0) {
        oauth_error(op_take(o), 400, "invalid_request", "Send token=... to revoke.");
        op_free(o);
        return;
    }
    o->pending = 2;
    if (sf_redis_cmd(ctx->redis, on_revoke_lookup, o, "GET " SF_RK_OAUTH_AT, o->csrf_hash) < 0)
        o->pending--;
    if (sf_redis_cmd(ctx->redis, on_revoke_lookup, o, "GET " SF_RK_OAUTH_RT, o->csrf_hash) < 0)
        o->pending--;
    if (o->pending == 0) {
        redis_down(o, NULL);
        op_free(o);
    }
}

/* ------------------------------------------------------------------ the resource side */

typedef struct token_op {
    gw_ctx *ctx;
    gw_token_cb cb;
    void *arg;
    int pending;      /* replies still to come: the key's, the grant's */
    int status;       /* 200, or 401/503 from the first that failed */
    const char *why;  /* the 401's sentence */
    char resource[300];
    char team[SF_ID_MAX];
    char key[SF_APIKEY_HASH_HEX];
} token_op;

/* The key's and the grant's EXISTS came back: a token lives only while both do, so a
 * revoked grant (sandfleet tokens revoke, /oauth/revoke, a reused code or refresh token)
 * ends every access token it ever issued at once, the rotated ones too. */
static void on_token_alive(redisAsyncContext *ac, void *r, void *priv, int is_key)
{
    token_op *t = priv;
    redisReply *rep = r;

    if (!rep || rep->type == REDIS_REPLY_ERROR)
        t->status = 503;
    else if ((rep->type != REDIS_REPLY_INTEGER || rep->integer != 1) && t->status == 200) {
        t->status = 401;
        t->why = is_key ? "The API key this token was granted with has been revoked; sign in "
                          "again."
                        : SF_MSG_TOKEN_UNKNOWN;
    }
    if (--t->pending > 0)
        return;
    if (t->status == 200)
        t->cb(t->arg, 200, t->team, t->key);
    else
        t->cb(t->arg, t->status, NULL, t->status == 401 ? t->why : NULL);
    free(t);
}

static void on_token_key(redisAsyncContext *ac, void *r, void *priv)
{
    on_token_alive(ac, r, priv, 1);
}

static void on_token_grant(redisAsyncContext *ac, void *r, void *priv)
{
    on_token_alive(ac, r, priv, 0);
}

static void on_token(redisAsyncContext *ac, void *r, void *priv)
{
    token_op *t = priv;
    redisReply *rep = r;
    json_t *g = reply_json(rep);
    const char *why = NULL, *grant;

    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        t->cb(t->arg, 503, NULL, NULL);
        free(t);
        json_decref(g);
        return;
    }
    grant = jstr(g, "grant");
    if (!g)
        why = SF_MSG_TOKEN_UNKNOWN;
    else if (json_integer_value(json_object_get(g, "exp")) < sf_now_ms())
        why = "The access token expired; refresh it, or sign in again.";
    else if (strcmp(jstr(g, "resource") ?: "", t->resource) != 0)
        why = "The access token was issued for another resource; get one for this server.";
    else if (!jstr(g, "team") || !jstr(g, "key") || strlen(jstr(g, "key")) >= sizeof(t->key) ||
             !grant || !sf_id_valid(grant))
        why = SF_MSG_TOKEN_UNKNOWN;
    if (why) {
        t->cb(t->arg, 401, NULL, why);
        free(t);
        json_decref(g);
        return;
    }
    snprintf(t->team, sizeof(t->team), "%s", jstr(g, "team"));
    snprintf(t->key, sizeof(t->key), "%s", jstr(g, "key"));
    t->status = 200;
    t->pending = 2;
    if (sf_apikeys_exists(t->ctx->redis, t->key, on_token_key, t) < 0)
        t->pending--, t->status = 503;
    if (sf_redis_cmd(t->ctx->redis, on_token_grant, t, "EXISTS " SF_RK_OAUTH_GRANT, grant) < 0)
        t->pending--, t->status = 503;
    json_decref(g);
    if (t->pending == 0) {
        t->pending = 1;
        on_token_alive(NULL, NULL, t, 0);
    }
}

void gw_oauth_token_check(gw_ctx *ctx, const char *token, const char *resource, gw_token_cb cb,
                          void *arg)
{
    char hash[SF_OAUTH_HASH_HEX];
    token_op *t;

    if (sf_oauth_hash(ctx->auth_secret, token, hash) < 0) {
        cb(arg, 401, NULL, "The access token is malformed; sign in again.");
        return;
    }
    if (!(t = calloc(1, sizeof(*t)))) {
        cb(arg, 503, NULL, NULL);
        return;
    }
    t->ctx = ctx;
    t->cb = cb;
    t->arg = arg;
    snprintf(t->resource, sizeof(t->resource), "%s", resource ? resource : "");
    if (sf_redis_cmd(ctx->redis, on_token, t, "GET " SF_RK_OAUTH_AT, hash) < 0)
        on_token(NULL, NULL, t);
}

/* ------------------------------------------------------------------ routes */

static void preflight(gw_req *req, void *arg)
{
    static const char *const h[] = {"Access-Control-Allow-Origin", "*",
                                    "Access-Control-Allow-Methods", "GET, POST",
                                    "Access-Control-Allow-Headers",
                                    "Content-Type, Authorization, MCP-Protocol-Version",
                                    "Access-Control-Max-Age", "600", NULL};
    gw_req_respond(req, 204, NULL, h, NULL, 0);
}

int gw_oauth_routes(gw_ctx *ctx)
{
    gw_router *r = ctx->router;
    static const char *const cors[] = {"/.well-known/oauth-protected-resource",
                                       "/.well-known/oauth-protected-resource/mcp",
                                       "/.well-known/oauth-authorization-server",
                                       "/oauth/register", "/oauth/token", "/oauth/revoke"};

    for (size_t i = 0; i < SF_ARRAY_LEN(cors); i++)
        if (gw_router_add(r, "OPTIONS", cors[i], preflight, ctx) < 0)
            return -ENOMEM;

    if (gw_router_add(r, "GET", "/.well-known/oauth-protected-resource", resource_metadata, ctx) < 0 ||
        gw_router_add(r, "GET", "/.well-known/oauth-protected-resource/mcp/", resource_metadata,
                      ctx) < 0 ||
        gw_router_add(r, "GET", "/.well-known/oauth-protected-resource/mcp", resource_metadata,
                      ctx) < 0 ||
        gw_router_add(r, "GET", "/.well-known/oauth-authorization-server", server_metadata, ctx) < 0 ||
        gw_router_add(r, "POST", "/oauth/register", do_register, ctx) < 0 ||
        gw_router_add(r, "GET", "/oauth/authorize", do_authorize, ctx) < 0 ||
        gw_router_add(r, "POST", "/oauth/authorize", do_authorize, ctx) < 0 ||
        gw_router_add(r, "POST", "/oauth/token", do_token, ctx) < 0 ||
        gw_router_add(r, "POST", "/oauth/revoke", do_revoke, ctx) < 0)
        return -ENOMEM;
    return 0;
}
