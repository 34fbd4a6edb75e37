#include "sf_redis.h"
#include "sf_util.h"
#include "sf_msg.h"

#include <errno.h>
#include <hiredis/adapters/libevent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sf_redis {
    struct event_base *base;
    redisAsyncContext *ac;
    int connected;
    char host[256];
    int port;             /* 0 = unix socket in host */
    struct event *ev_retry;
    void (*on_connect_fn)(void *arg);
    void *on_connect_arg;
};

static int url_parse(const char *url, char *host, size_t hostlen, int *port)
{
    int64_t p = 6379;
    const char *colon;

    if (!strncmp(url, "unix:", 5)) {
        url += 5;
        while (url[0] == '/' && url[1] == '/')
            url++;
        if (snprintf(host, hostlen, "%s", url) >= (int)hostlen || !*host)
            return -EINVAL;
        *port = 0;
        return 0;
    }
    if (!strncmp(url, "redis://", 8))
        url += 8;
    colon = strrchr(url, ':');
    if (colon) {
        if ((size_t)(colon - url) >= hostlen || sf_parse_i64(colon + 1, 1, 65535, &p) < 0)
            return -EINVAL;
        memcpy(host, url, (size_t)(colon - url));
        host[colon - url] = '\0';
    } else if (snprintf(host, hostlen, "%s", url) >= (int)hostlen) {
        return -EINVAL;
    }
    if (!*host)
        return -EINVAL;
    *port = (int)p;
    return 0;
}

static void redis_connect(sf_redis *r);

static void on_connect(const redisAsyncContext *ac, int status)
{
    sf_redis *r = ac->data;

    if (status != REDIS_OK) {
        r->ac = NULL; /* hiredis frees the context */
        event_add(r->ev_retry, &(struct timeval){0, 500 * 1000});
        return;
    }
    r->connected = 1;
    if (r->on_connect_fn)
        r->on_connect_fn(r->on_connect_arg);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    sf_redis *r = ac->data;

    r->connected = 0;
    r->ac = NULL;
    if (r->ev_retry)
        event_add(r->ev_retry, &(struct timeval){0, 500 * 1000});
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    redis_connect(arg);
}

static void redis_connect(sf_redis *r)
{
    redisAsyncContext *ac =
        r->port ? redisAsyncConnect(r->host, r->port) : redisAsyncConnectUnix(r->host);

    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        event_add(r->ev_retry, &(struct timeval){0, 500 * 1000});
        return;
    }
    ac->data = r;
    redisLibeventAttach(ac, r->base);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    r->ac = ac;
}

sf_redis *sf_redis_new(struct event_base *base, const char *url, char *why, size_t whylen)
{
    sf_redis *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    if (url_parse(url, r->host, sizeof(r->host), &r->port) < 0) {
        snprintf(why, whylen, SF_MSG_REDIS_URL_BAD_FMT, url);
        free(r);
        return NULL;
    }
    r->base = base;
    r->ev_retry = evtimer_new(base, on_retry, r);
    redis_connect(r);
    return r;
}

void sf_redis_free(sf_redis *r)
{
    if (!r)
        return;
    event_free(r->ev_retry);
    r->ev_retry = NULL;
    if (r->ac) {
        redisAsyncContext *ac = r->ac;
        ac->data = r;
        r->ac = NULL;
        redisAsyncSetDisconnectCallback(ac, NULL);
        redisAsyncFree(ac);
    }
    free(r);
}

void sf_redis_on_connect(sf_redis *r, void (*fn)(void *arg), void *arg)
{
    r->on_connect_fn = fn;
    r->on_connect_arg = arg;
    if (fn && r->connected)
        fn(arg);
}

int sf_redis_connected(const sf_redis *r)
{
    return r->connected;
}

int sf_redis_cmd(sf_redis *r, redisCallbackFn *cb, void *priv, const char *fmt, ...)
{
    va_list ap;
    int rc;

    if (!r->connected || !r->ac)
        return -ENOTCONN;
    va_start(ap, fmt);
    rc = redisvAsyncCommand(r->ac, cb, priv, fmt, ap);
    va_end(ap);
    return rc == REDIS_OK ? 0 : -ENOTCONN;
}

int sf_redis_cmdargv(sf_redis *r, redisCallbackFn *cb, void *priv, int argc, const char **argv,
                     const size_t *argvlen)
{
    if (!r->connected || !r->ac)
        return -ENOTCONN;
    return redisAsyncCommandArgv(r->ac, cb, priv, argc, argv, argvlen) == REDIS_OK ? 0
                                                                                   : -ENOTCONN;
}

int sf_redis_is_oom(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ERROR && rep->str && !strncmp(rep->str, "OOM ", 4);
}

redisContext *sf_redis_connect_sync(const char *url, char *why, size_t whylen)
{
    char host[256];
    int port;
    redisContext *c;
    struct timeval tv = {2, 0};

    if (url_parse(url, host, sizeof(host), &port) < 0) {
        snprintf(why, whylen, SF_MSG_REDIS_URL_BAD_FMT, url);
        return NULL;
    }
    c = port ? redisConnectWithTimeout(host, port, tv) : redisConnectUnixWithTimeout(host, tv);
    if (!c || c->err) {
        snprintf(why, whylen, "Cannot reach Redis at %s: %s.", url, c ? c->errstr : "no memory");
        if (c)
            redisFree(c);
        return NULL;
    }
    return c;
}

/* ---- scripts by SHA ---- */

/* SHA-1 (FIPS 180-4), for the script's EVALSHA name only. */
static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void sha1_block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f, k, t;

    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (int i = 0; i < 80; i++) {
        if (i < 20)
            f = (b & c) | (~b & d), k = 0x5A827999;
        else if (i < 40)
            f = b ^ c ^ d, k = 0x6ED9EBA1;
        else if (i < 60)
            f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDC;
        else
            f = b ^ c ^ d, k = 0xCA62C1D6;
        t = rol(a, 5) + f + e + k + w[i];
        e = d, d = c, c = rol(b, 30), b = a, a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
}

static void sha1_hex(const char *src, size_t n, char out[41])
{
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    unsigned char last[128];
    size_t full = n / 64 * 64, rest = n - full, tail;
    uint64_t bits = (uint64_t)n * 8;

    for (size_t i = 0; i < full; i += 64)
        sha1_block(h, (const unsigned char *)src + i);
    memset(last, 0, sizeof(last));
    memcpy(last, src + full, rest);
    last[rest] = 0x80;
    tail = rest + 1 + 8 <= 64 ? 64 : 128;
    for (int i = 0; i < 8; i++)
        last[tail - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha1_block(h, last);
    if (tail == 128)
        sha1_block(h, last + 64);
    for (int i = 0; i < 5; i++)
        snprintf(out + 8 * i, 9, "%08x", h[i]);
}

const char *sf_redis_script_sha(sf_redis_script *s)
{
    char sha[41];

    if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE)) {
        sha1_hex(s->src, strlen(s->src), sha);
        /* every thread computes the same 40 bytes: the first to get here publishes */
        if (!__atomic_exchange_n(&s->ready, 2, __ATOMIC_ACQ_REL)) {
            memcpy(s->sha, sha, sizeof(sha));
            __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
        }
        while (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) != 1)
            ;
    }
    return s->sha;
}

static int is_noscript(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOSCRIPT", 8);
}

typedef struct script_call {
    sf_redis *r;
    sf_redis_script *s;
    redisCallbackFn *cb;
    void *priv;
    int argc; /* EVALSHA/EVAL, sha/source, numkeys, keys and args */
    const char **argv;
    size_t *lens;
    char numkeys[16];
    char *data; /* copies of the keys and args */
} script_call;

static void script_call_free(script_call *sc)
{
    free(sc->argv);
    free(sc->lens);
    free(sc->data);
    free(sc);
}

static void on_script_reply(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    script_call *sc = priv;

    if (is_noscript(rep) && !strcmp(sc->argv[0], "EVALSHA")) {
        /* Redis does not have it (first use, a restart, SCRIPT FLUSH): the source loads it */
        sc->argv[0] = "EVAL";
        sc->argv[1] = sc->s->src;
        sc->lens[0] = 4;
        sc->lens[1] = strlen(sc->s->src);
        if (sf_redis_cmdargv(sc->r, on_script_reply, sc, sc->argc, sc->argv, sc->lens) == 0)
            return;
        rep = NULL;
    }
    sc->cb(ac, rep, sc->priv);
    script_call_free(sc);
}

int sf_redis_script_call(sf_redis *r, sf_redis_script *s, redisCallbackFn *cb, void *priv,
                         int nkeys, int nargs, const char **argv, const size_t *lens)
{
    script_call *sc;
    size_t total = 0;
    char *p;
    int n = nkeys + nargs, rc;

    if (!sf_redis_connected(r))
        return -ENOTCONN;
    if (nkeys < 0 || nargs < 0 || n > SF_REDIS_SCRIPT_ARGS_MAX)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        total += lens[i];
    if (!(sc = calloc(1, sizeof(*sc))) || !(sc->argv = calloc((size_t)n + 3, sizeof(char *))) ||
        !(sc->lens = calloc((size_t)n + 3, sizeof(size_t))) ||
        !(sc->data = malloc(total ? total : 1))) {
        if (sc)
            script_call_free(sc);
        return -ENOMEM;
    }
    sc->r = r;
    sc->s = s;
    sc->cb = cb;
    sc->priv = priv;
    sc->argc = n + 3;
    snprintf(sc->numkeys, sizeof(sc->numkeys), "%d", nkeys);
    sc->argv[0] = "EVALSHA";
    sc->argv[1] = sf_redis_script_sha(s);
    sc->argv[2] = sc->numkeys;
    sc->lens[0] = 7;
    sc->lens[1] = 40;
    sc->lens[2] = strlen(sc->numkeys);
    for (int i = 0, off = 0; i < n; off += (int)lens[i], i++) {
        p = sc->data + off;
        memcpy(p, argv[i], lens[i]);
        sc->argv[3 + i] = p;
        sc->lens[3 + i] = lens[i];
    }
    if ((rc = sf_redis_cmdargv(r, on_script_reply, sc, sc->argc, sc->argv, sc->lens)) < 0)
        script_call_free(sc);
    return rc;
}

redisReply *sf_redis_script_sync(redisContext *c, sf_redis_script *s, int nkeys, int nargs,
                                 const char **argv, const size_t *lens)
{
    const char *a[3 + 64];
    size_t l[3 + 64];
    char numkeys[16];
    redisReply *rep;
    int n = nkeys + nargs;

    if (nkeys < 0 || nargs < 0 || n > 64)
        return NULL;
    snprintf(numkeys, sizeof(numkeys), "%d", nkeys);
    a[0] = "EVALSHA";
    a[1] = sf_redis_script_sha(s);
    a[2] = numkeys;
    for (int i = 0; i < 3; i++)
        l[i] = strlen(a[i]);
    for (int i = 0; i < n; i++) {
        a[3 + i] = argv[i];
        l[3 + i] = lens ? lens[i] : strlen(argv[i]);
    }
    rep = redisCommandArgv(c, n + 3, a, l);
    if (is_noscript(rep)) {
        freeReplyObject(rep);
        a[0] = "EVAL";
        a[1] = s->src;
        l[0] = 4;
        l[1] = strlen(s->src);
        rep = redisCommandArgv(c, n + 3, a, l);
    }
    return rep;
}
