#include "sf_redis.h"
#include "sf_util.h"
#include "sf_msg.h"

#include <errno.h>
#include <pthread.h>
#include <strings.h>
#include <hiredis/adapters/libevent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- addresses: one node, or several seeds ---- */

static int addr_parse(const char *a, size_t n, char *host, size_t hostlen, int *port)
{
    int64_t p = 6379;
    const char *colon = NULL;

    if (n >= 5 && !strncmp(a, "unix:", 5)) {
        a += 5, n -= 5;
        while (n >= 2 && a[0] == '/' && a[1] == '/')
            a++, n--;
        if (n == 0 || n >= hostlen)
            return -EINVAL;
        memcpy(host, a, n);
        host[n] = '\0';
        *port = 0;
        return 0;
    }
    if (n >= 8 && !strncmp(a, "redis://", 8))
        a += 8, n -= 8;
    for (size_t i = n; i > 0; i--)
        if (a[i - 1] == ':') {
            colon = a + i - 1;
            break;
        }
    if (colon) {
        char num[8];
        size_t nl = n - (size_t)(colon + 1 - a);
        if ((size_t)(colon - a) >= hostlen || nl == 0 || nl >= sizeof(num))
            return -EINVAL;
        memcpy(num, colon + 1, nl);
        num[nl] = '\0';
        if (sf_parse_i64(num, 1, 65535, &p) < 0)
            return -EINVAL;
        n = (size_t)(colon - a);
    } else if (n >= hostlen) {
        return -EINVAL;
    }
    if (n == 0)
        return -EINVAL;
    memcpy(host, a, n);
    host[n] = '\0';
    *port = (int)p;
    return 0;
}

/* "redis://h1:p1,h2:p2" (each item may carry its own redis://): calls add for each. */
static int url_each(const char *url, int (*add)(void *arg, const char *host, int port),
                    void *arg)
{
    char host[256];
    int port, n = 0;

    if (!url || !*url)
        return -EINVAL;
    if (!strncmp(url, "unix:", 5)) /* a path may hold commas */
        return addr_parse(url, strlen(url), host, sizeof(host), &port) < 0 ? -EINVAL
                                                                            : add(arg, host, port);
    if (!strncmp(url, "redis://", 8))
        url += 8;
    for (const char *p = url;; n++) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int rc;
        if (addr_parse(p, len, host, sizeof(host), &port) < 0 || port == 0)
            return -EINVAL;
        if ((rc = add(arg, host, port)) < 0)
            return rc;
        if (!c)
            break;
        p = c + 1;
    }
    return 0;
}

/* ---- hash slots ---- */

static uint16_t crc16(const char *p, size_t n)
{
    uint16_t crc = 0;

    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((unsigned char)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

int sf_redis_slot(const char *key, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (key[i] == '{') {
            for (size_t j = i + 1; j < n; j++)
                if (key[j] == '}') {
                    if (j > i + 1)
                        key += i + 1, n = j - i - 1;
                    break;
                }
            break;
        }
    return crc16(key, n) & (SF_REDIS_SLOTS - 1);
}

static int ieq(const char *a, size_t n, const char *b)
{
    return strlen(b) == n && !strncasecmp(a, b, n);
}

/* The slot a command's keys live in (they share one: the state module's rule), or -1 for a
 * command without keys (PUBLISH, SUBSCRIBE, PING, ...), which any node answers. */
static int cmd_slot(int argc, const char *const *argv, const size_t *lens)
{
    if (argc < 2)
        return -1;
    if (ieq(argv[0], lens[0], "EVALSHA") || ieq(argv[0], lens[0], "EVAL") ||
        ieq(argv[0], lens[0], "EVALSHA_RO") || ieq(argv[0], lens[0], "EVAL_RO")) {
        if (argc < 4 || lens[2] == 0 || (lens[2] == 1 && argv[2][0] == '0'))
            return -1;
        return sf_redis_slot(argv[3], lens[3]);
    }
    if (ieq(argv[0], lens[0], "PUBLISH") || ieq(argv[0], lens[0], "SUBSCRIBE") ||
        ieq(argv[0], lens[0], "PSUBSCRIBE") || ieq(argv[0], lens[0], "UNSUBSCRIBE") ||
        ieq(argv[0], lens[0], "PING") || ieq(argv[0], lens[0], "SCAN") ||
        ieq(argv[0], lens[0], "INFO") || ieq(argv[0], lens[0], "CLUSTER") ||
        ieq(argv[0], lens[0], "SCRIPT") || ieq(argv[0], lens[0], "WAIT"))
        return -1;
    return sf_redis_slot(argv[1], lens[1]);
}

/* The first 4 arguments of a command formatted as RESP (hiredis's redisFormatCommand). */
static int resp_args(const char *buf, size_t len, const char *argv[4], size_t lens[4])
{
    const char *p = buf, *end = buf + len;
    long n, l;
    char *e;
    int k = 0;

    if (len < 4 || *p != '*')
        return -EINVAL;
    n = strtol(p + 1, &e, 10);
    if (n <= 0 || e + 2 > end || e[0] != '\r')
        return -EINVAL;
    p = e + 2;
    for (; k < n && k < 4; k++) {
        if (p >= end || *p != '$')
            return -EINVAL;
        l = strtol(p + 1, &e, 10);
        if (l < 0 || e + 2 > end || (size_t)(end - (e + 2)) < (size_t)l + 2)
            return -EINVAL;
        argv[k] = e + 2;
        lens[k] = (size_t)l;
        p = e + 2 + l + 2;
    }
    return k;
}

/* CLUSTER SLOTS: [[start, end, [host, port, id], replicas...], ...]; add(arg, host, port,
 * start, end, replicas) for each range's master; asked: the host the map came from. -EINVAL
 * on a reply of another shape. */
static int slots_each(const redisReply *rep, const char *asked,
                      int (*add)(void *arg, const char *host, int port, int from, int to,
                                 int replicas),
                      void *arg)
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        return -EINVAL;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i], *m;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            (m = e->element[2])->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            (m->element[0]->type != REDIS_REPLY_STRING &&
             m->element[0]->type != REDIS_REPLY_NIL) ||
            m->element[1]->type != REDIS_REPLY_INTEGER || e->element[0]->integer < 0 ||
            e->element[1]->integer >= SF_REDIS_SLOTS ||
            e->element[0]->integer > e->element[1]->integer)
            return -EINVAL;
        /* an endpoint the node does not know (a cluster of one that never met another
         * node: "", or NULL, or "?") is the address the map was asked at */
        const char *host = m->element[0]->str;
        if (!host || !*host || !strcmp(host, "?"))
            host = asked;
        if (add(arg, host, (int)m->element[1]->integer,
                (int)e->element[0]->integer, (int)e->element[1]->integer,
                (int)e->elements - 3) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": 1 (moved) or 2 (ask) with the address. */
static int redirect_parse(const redisReply *rep, int *slot, char *host, size_t hostlen,
                          int *port)
{
    const char *p, *sp;
    int kind;
    int64_t s;
    char num[8];

    if (!rep || rep->type != REDIS_REPLY_ERROR || !rep->str)
        return 0;
    if (!strncmp(rep->str, "MOVED ", 6))
        kind = 1, p = rep->str + 6;
    else if (!strncmp(rep->str, "ASK ", 4))
        kind = 2, p = rep->str + 4;
    else
        return 0;
    if (!(sp = strchr(p, ' ')) || (size_t)(sp - p) >= sizeof(num))
        return 0;
    memcpy(num, p, (size_t)(sp - p));
    num[sp - p] = '\0';
    if (sf_parse_i64(num, 0, SF_REDIS_SLOTS - 1, &s) < 0 ||
        addr_parse(sp + 1, strlen(sp + 1), host, hostlen, port) < 0 || *port == 0)
        return 0;
    *slot = (int)s;
    return kind;
}

/* ---- the asynchronous client: one node, or a cluster ---- */

#define NODES_MAX 64
#define RETRY_MS 500
#define TICK_MS 100
#define REDIRECTS_MAX 5
#define SF_REDIS_WAIT_MS 200

enum { MODE_UNKNOWN, MODE_SINGLE, MODE_CLUSTER };

typedef struct rnode {
    sf_redis *r;
    char host[256];
    int port; /* 0 = unix socket in host */
    redisAsyncContext *ac;
    int connected;
    int subscribed; /* a SUBSCRIBE went out on it: only Pub/Sub from now on */
    int replicas;   /* a master's replicas, as the last slot map said */
    int64_t down_until; /* a connect failed: not tried again before this (monotonic ms) */
} rnode;

struct sf_redis {
    struct event_base *base;
    int mode;
    int nnodes;
    rnode nodes[NODES_MAX];
    uint8_t slots[SF_REDIS_SLOTS]; /* node index + 1; 0: not known */
    int any;                       /* the node of keyless commands (Pub/Sub), or -1 */
    int stale;                     /* the slot map needs asking again */
    int asking;                    /* a CLUSTER SLOTS is on its way */
    struct event *ev_tick;
    void (*on_connect_fn)(void *arg);
    void *on_connect_arg;
};

static void node_connect(rnode *n);

static void tick_arm(sf_redis *r, int ms)
{
    if (r->ev_tick && !evtimer_pending(r->ev_tick, NULL))
        event_add(r->ev_tick, &(struct timeval){ms / 1000, (ms % 1000) * 1000});
}

static int node_find(sf_redis *r, const char *host, int port)
{
    for (int i = 0; i < r->nnodes; i++)
        if (r->nodes[i].port == port && !strcmp(r->nodes[i].host, host))
            return i;
    if (r->nnodes == NODES_MAX || strlen(host) >= sizeof(r->nodes[0].host))
        return -ENOSPC;
    rnode *n = &r->nodes[r->nnodes];
    memset(n, 0, sizeof(*n));
    n->r = r;
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    return r->nnodes++;
}

static int seed_add(void *arg, const char *host, int port)
{
    return node_find(arg, host, port) < 0 ? -EINVAL : 0;
}

static void fire_connect(sf_redis *r)
{
    if (r->on_connect_fn)
        r->on_connect_fn(r->on_connect_arg);
}

/* The node for keyless commands: the one in use while it is up, else any connected one
 * (on_connect then runs again: a subscriber subscribes there). */
static void any_pick(sf_redis *r)
{
    if (r->any >= 0 && r->nodes[r->any].connected)
        return;
    r->any = -1;
    for (int i = 0; i < r->nnodes; i++)
        if (r->nodes[i].connected) {
            r->any = i;
            fire_connect(r);
            return;
        }
}

static int slot_add(void *arg, const char *host, int port, int from, int to, int replicas)
{
    sf_redis *r = arg;
    int i = node_find(r, host, port);

    if (i < 0)
        return i;
    r->nodes[i].replicas = replicas;
    for (int s = from; s <= to; s++)
        r->slots[s] = (uint8_t)(i + 1);
    return 0;
}

static void on_slots(redisAsyncContext *ac, void *reply, void *priv)
{
    sf_redis *r = priv;
    redisReply *rep = reply;

    r->asking = 0;
    if (rep && rep->type == REDIS_REPLY_ERROR && r->mode == MODE_UNKNOWN) {
        /* a plain Redis ("cluster support disabled"): everything to this node */
        rnode *n = ac->data;
        r->mode = MODE_SINGLE;
        r->stale = 0;
        r->any = (int)(n - r->nodes);
        fire_connect(r);
        return;
    }
    if (!rep || slots_each(rep, ((rnode *)ac->data)->host, slot_add, r) < 0) {
        tick_arm(r, TICK_MS);
        return;
    }
    r->stale = 0;
    if (r->mode == MODE_UNKNOWN)
        r->mode = MODE_CLUSTER;
    any_pick(r);
    /* A slot whose master is not connected yet: connect now (a refresh follows a failover).
     * A slot without a master, or whose master was lost and is still named (the node asked
     * has not heard of the failover yet): the map stays stale and is asked again, so it is
     * new before a command meets the lost master (not only after one did). */
    for (int s = 0; s < SF_REDIS_SLOTS; s++) {
        rnode *n = r->slots[s] ? &r->nodes[r->slots[s] - 1] : NULL;
        if (n && !n->ac && n->down_until <= sf_mono_ms())
            node_connect(n);
        if (!n || !n->ac)
            r->stale = 1;
    }
    if (r->stale)
        tick_arm(r, TICK_MS);
}

/* Asks a connected node that is not subscribed for the slot map. 0 when sent. */
static int slots_ask(sf_redis *r)
{
    if (r->asking)
        return 0;
    for (int i = 0; i < r->nnodes; i++) {
        rnode *n = &r->nodes[i];
        if (n->connected && !n->subscribed &&
            redisAsyncCommand(n->ac, on_slots, r, "CLUSTER SLOTS") == REDIS_OK) {
            r->asking = 1;
            return 0;
        }
    }
    return -ENOTCONN;
}

static void on_node_connect(const redisAsyncContext *ac, int status)
{
    rnode *n = ac->data;
    sf_redis *r = n->r;

    if (status != REDIS_OK) {
        n->ac = NULL; /* hiredis frees the context */
        n->down_until = sf_mono_ms() + (r->mode == MODE_SINGLE ? RETRY_MS : 200);
        if (r->mode == MODE_CLUSTER)
            r->stale = 1;
        tick_arm(r, TICK_MS);
        return;
    }
    n->connected = 1;
    n->down_until = 0;
    if (r->mode == MODE_UNKNOWN || r->stale)
        slots_ask(r);
    else if (r->mode == MODE_SINGLE || r->any < 0)
        any_pick(r);
}

static void on_node_disconnect(const redisAsyncContext *ac, int status)
{
    rnode *n = ac->data;
    sf_redis *r = n->r;
    int i = (int)(n - r->nodes);

    n->connected = 0;
    n->subscribed = 0;
    n->ac = NULL;
    n->down_until = sf_mono_ms() + (r->mode == MODE_SINGLE ? RETRY_MS : 100);
    if (r->any == i)
        r->any = -1;
    if (r->mode == MODE_CLUSTER)
        r->stale = 1; /* a master lost: its replica takes its slots */
    if (r->ev_tick)
        tick_arm(r, TICK_MS);
}

static void node_connect(rnode *n)
{
    redisAsyncContext *ac =
        n->port ? redisAsyncConnect(n->host, n->port) : redisAsyncConnectUnix(n->host);

    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        n->down_until = sf_mono_ms() + RETRY_MS;
        tick_arm(n->r, TICK_MS);
        return;
    }
    ac->data = n;
    redisLibeventAttach(ac, n->r->base);
    redisAsyncSetConnectCallback(ac, on_node_connect);
    redisAsyncSetDisconnectCallback(ac, on_node_disconnect);
    n->ac = ac;
}

/* Every TICK_MS while something is missing: connect what is needed, ask for the map. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    sf_redis *r = arg;
    int64_t now = sf_mono_ms();
    int want = 0, busy = 0;

    (void)fd, (void)what;
    if (r->mode != MODE_CLUSTER) {
        /* one node (or not known yet): the seeds in turn until one answers */
        for (int i = 0; i < r->nnodes; i++)
            busy |= r->nodes[i].ac != NULL;
        for (int i = 0; !busy && i < r->nnodes; i++)
            if (r->nodes[i].down_until <= now) {
                node_connect(&r->nodes[i]);
                busy = 1;
            }
        if (!busy || r->mode == MODE_UNKNOWN || !r->nodes[r->any >= 0 ? r->any : 0].connected)
            tick_arm(r, TICK_MS);
        return;
    }
    if (r->stale && slots_ask(r) < 0) {
        /* nothing connected to ask: connect to a known node that may answer */
        for (int i = 0; i < r->nnodes; i++) {
            rnode *n = &r->nodes[i];
            busy |= n->ac && !n->connected;
        }
        for (int i = 0; !busy && i < r->nnodes; i++)
            if (!r->nodes[i].ac && r->nodes[i].down_until <= now) {
                node_connect(&r->nodes[i]);
                break;
            }
    }
    if (r->any < 0)
        any_pick(r);
    if (r->any < 0)
        want = 1;
    if (r->stale || want)
        tick_arm(r, TICK_MS);
}

sf_redis *sf_redis_new(struct event_base *base, const char *url, char *why, size_t whylen)
{
    sf_redis *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    if (url_each(url, seed_add, r) < 0 || r->nnodes == 0) {
        snprintf(why, whylen, SF_MSG_REDIS_URL_BAD_FMT, url);
        free(r);
        return NULL;
    }
    r->base = base;
    r->any = -1;
    r->ev_tick = evtimer_new(base, on_tick, r);
    node_connect(&r->nodes[0]);
    return r;
}

void sf_redis_free(sf_redis *r)
{
    if (!r)
        return;
    event_free(r->ev_tick);
    r->ev_tick = NULL;
    for (int i = 0; i < r->nnodes; i++) {
        redisAsyncContext *ac = r->nodes[i].ac;
        if (!ac)
            continue;
        r->nodes[i].ac = NULL;
        redisAsyncSetDisconnectCallback(ac, NULL);
        redisAsyncFree(ac); /* pending callbacks get a NULL reply */
    }
    free(r);
}

void sf_redis_on_connect(sf_redis *r, void (*fn)(void *arg), void *arg)
{
    r->on_connect_fn = fn;
    r->on_connect_arg = arg;
    if (fn && sf_redis_connected(r))
        fn(arg);
}

int sf_redis_connected(const sf_redis *r)
{
    return r->mode != MODE_UNKNOWN && r->any >= 0 && r->nodes[r->any].connected;
}

int sf_redis_is_cluster(const sf_redis *r)
{
    return r->mode == MODE_CLUSTER;
}

/* A command on its way: its RESP bytes are kept until its answer, to follow a redirect. */
typedef struct rpend {
    sf_redis *r;
    redisCallbackFn *cb;
    void *priv;
    int slot;
    int hops;
    size_t len;
    char buf[]; /* RESP */
} rpend;

static void on_rpend_reply(redisAsyncContext *ac, void *reply, void *priv);

/* The node a slot lives on (connecting it when needed), or NULL while none is known. */
static rnode *slot_node(sf_redis *r, int slot)
{
    rnode *n;

    if (r->mode == MODE_SINGLE || slot < 0)
        return r->any >= 0 ? &r->nodes[r->any] : NULL;
    if (!r->slots[slot])
        return NULL;
    n = &r->nodes[r->slots[slot] - 1];
    if (!n->ac && n->down_until <= sf_mono_ms())
        node_connect(n); /* commands wait in its buffer until it is connected */
    return n->ac && !n->subscribed ? n : NULL;
}

static int rcmd_send(rpend *c, rnode *n, int asking)
{
    if (!n || !n->ac)
        return -ENOTCONN;
    if (asking && redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK)
        return -ENOTCONN;
    return redisAsyncFormattedCommand(n->ac, on_rpend_reply, c, c->buf, c->len) == REDIS_OK
               ? 0
               : -ENOTCONN;
}

static void on_rpend_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    rpend *c = priv;
    sf_redis *r = c->r;
    char host[256];
    int slot, port, kind, i;

    /* (r is only touched while it lives: its free answers every pending command with NULL
     * after the nodes' contexts are detached, and no redirect is followed then) */
    if (reply && c->hops < REDIRECTS_MAX &&
        (kind = redirect_parse(reply, &slot, host, sizeof(host), &port)) &&
        (i = node_find(r, host, port)) >= 0) {
        rnode *n = &r->nodes[i];
        c->hops++;
        if (kind == 1) { /* MOVED: the slot lives there now; the whole map is asked again */
            r->slots[slot] = (uint8_t)(i + 1);
            r->stale = 1;
            tick_arm(r, 0);
        }
        if (!n->ac)
            node_connect(n);
        if (rcmd_send(c, n, kind == 2) == 0)
            return;
        reply = NULL;
    }
    if (c->cb)
        c->cb(ac, reply, c->priv);
    free(c);
}

static int rcmd_submit(sf_redis *r, redisCallbackFn *cb, void *priv, const char *buf,
                       size_t len)
{
    const char *argv[4];
    size_t lens[4];
    int argc = resp_args(buf, len, argv, lens), rc;
    rpend *c;
    rnode *n;

    if (!sf_redis_connected(r))
        return -ENOTCONN;
    if (argc < 1)
        return -EINVAL;
    if (!(c = malloc(sizeof(*c) + len)))
        return -ENOMEM;
    c->r = r;
    c->cb = cb;
    c->priv = priv;
    c->hops = 0;
    c->len = len;
    memcpy(c->buf, buf, len);
    c->slot = r->mode == MODE_CLUSTER ? cmd_slot(argc, argv, lens) : -1;
    n = slot_node(r, c->slot);
    if (c->slot < 0 && (ieq(argv[0], lens[0], "SUBSCRIBE") ||
                        ieq(argv[0], lens[0], "PSUBSCRIBE"))) {
        /* hiredis calls a subscription's callback for each message, until it ends: the
         * caller's own, with no redirect to follow (any node serves Pub/Sub) */
        free(c);
        if (!n || !n->ac)
            return -ENOTCONN;
        n->subscribed = 1;
        return redisAsyncFormattedCommand(n->ac, cb, priv, buf, len) == REDIS_OK ? 0 : -ENOTCONN;
    }
    if ((rc = rcmd_send(c, n, 0)) < 0)
        free(c);
    return rc;
}

int sf_redis_cmd(sf_redis *r, redisCallbackFn *cb, void *priv, const char *fmt, ...)
{
    va_list ap;
    char *buf = NULL;
    int len, rc;

    if (!sf_redis_connected(r))
        return -ENOTCONN;
    va_start(ap, fmt);
    len = redisvFormatCommand(&buf, fmt, ap);
    va_end(ap);
    if (len < 0)
        return -ENOMEM;
    rc = rcmd_submit(r, cb, priv, buf, (size_t)len);
    redisFreeCommand(buf);
    return rc;
}

int sf_redis_cmdargv(sf_redis *r, redisCallbackFn *cb, void *priv, int argc, const char **argv,
                     const size_t *argvlen)
{
    char *buf = NULL;
    long long len;
    int rc;

    if (!sf_redis_connected(r))
        return -ENOTCONN;
    if ((len = redisFormatCommandArgv(&buf, argc, argv, argvlen)) < 0)
        return -ENOMEM;
    rc = rcmd_submit(r, cb, priv, buf, (size_t)len);
    redisFreeCommand(buf);
    return rc;
}

int sf_redis_is_oom(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ERROR && rep->str && !strncmp(rep->str, "OOM ", 4);
}

/* ---- the blocking client: a seed's context, and the cluster's other nodes beside it ---- */

/* Every context sf_redis_connect_sync handed out that talks to a cluster, with the
 * contexts of the other masters it reached (a tool's few connections: a short list). */
typedef struct sync_node {
    char host[256];
    int port;
    redisContext *c;
} sync_node;

typedef struct sync_cluster {
    redisContext *seed;
    int nnodes;
    sync_node nodes[NODES_MAX];
    uint8_t slots[SF_REDIS_SLOTS];
    struct sync_cluster *next;
} sync_cluster;

static pthread_mutex_t sync_mu = PTHREAD_MUTEX_INITIALIZER;
static sync_cluster *sync_list;

static sync_cluster *sync_find(redisContext *c)
{
    sync_cluster *k;

    pthread_mutex_lock(&sync_mu);
    for (k = sync_list; k && k->seed != c; k = k->next)
        ;
    pthread_mutex_unlock(&sync_mu);
    return k;
}

static int sync_node_find(sync_cluster *k, const char *host, int port)
{
    for (int i = 0; i < k->nnodes; i++)
        if (k->nodes[i].port == port && !strcmp(k->nodes[i].host, host))
            return i;
    if (k->nnodes == NODES_MAX || strlen(host) >= sizeof(k->nodes[0].host))
        return -ENOSPC;
    snprintf(k->nodes[k->nnodes].host, sizeof(k->nodes[0].host), "%s", host);
    k->nodes[k->nnodes].port = port;
    k->nodes[k->nnodes].c = NULL;
    return k->nnodes++;
}

static int sync_slot_add(void *arg, const char *host, int port, int from, int to, int replicas)
{
    (void)replicas;
    sync_cluster *k = arg;
    int i = sync_node_find(k, host, port);

    if (i < 0)
        return i;
    for (int s = from; s <= to; s++)
        k->slots[s] = (uint8_t)(i + 1);
    return 0;
}

static redisContext *sync_node_ctx(sync_cluster *k, int i)
{
    sync_node *n = &k->nodes[i];
    struct timeval tv = {2, 0};

    if (n->c && n->c->err) {
        if (n->c != k->seed)
            redisFree(n->c);
        n->c = NULL;
    }
    if (!n->c) {
        n->c = redisConnectWithTimeout(n->host, n->port, tv);
        if (n->c && n->c->err) {
            redisFree(n->c);
            n->c = NULL;
        }
    }
    return n->c;
}

typedef struct seed_try {
    redisContext *c;
    char host[256];
    char url[300];
    char err[200];
} seed_try;

static int seed_connect(void *arg, const char *host, int port)
{
    seed_try *t = arg;
    struct timeval tv = {2, 0};
    redisContext *c;

    if (t->c)
        return 0;
    c = port ? redisConnectWithTimeout(host, port, tv) : redisConnectUnixWithTimeout(host, tv);
    if (c && !c->err) {
        t->c = c;
        snprintf(t->host, sizeof(t->host), "%s", host);
        return 0;
    }
    snprintf(t->err, sizeof(t->err), "%s", c ? c->errstr : "no memory");
    if (c)
        redisFree(c);
    return 0;
}

redisContext *sf_redis_connect_sync(const char *url, char *why, size_t whylen)
{
    seed_try t = {0};
    redisReply *rep;
    sync_cluster *k;

    if (url_each(url, seed_connect, &t) < 0) {
        snprintf(why, whylen, SF_MSG_REDIS_URL_BAD_FMT, url);
        if (t.c)
            redisFree(t.c);
        return NULL;
    }
    if (!t.c) {
        snprintf(why, whylen, "Cannot reach Redis at %s: %s.", url, t.err);
        return NULL;
    }
    /* a cluster: its slot map, so each command goes to its slot's master */
    rep = redisCommand(t.c, "CLUSTER SLOTS");
    if (rep && rep->type == REDIS_REPLY_ARRAY && (k = calloc(1, sizeof(*k)))) {
        k->seed = t.c;
        if (slots_each(rep, t.host, sync_slot_add, k) < 0) {
            free(k);
        } else {
            pthread_mutex_lock(&sync_mu);
            k->next = sync_list;
            sync_list = k;
            pthread_mutex_unlock(&sync_mu);
        }
    }
    freeReplyObject(rep);
    return t.c;
}

void sf_redis_sync_free(redisContext *c)
{
    sync_cluster *k, **pp;

    if (!c)
        return;
    pthread_mutex_lock(&sync_mu);
    for (pp = &sync_list; *pp && (*pp)->seed != c; pp = &(*pp)->next)
        ;
    k = *pp;
    if (k)
        *pp = k->next;
    pthread_mutex_unlock(&sync_mu);
    for (int i = 0; k && i < k->nnodes; i++)
        if (k->nodes[i].c && k->nodes[i].c != c)
            redisFree(k->nodes[i].c);
    free(k);
    redisFree(c);
}

static redisReply *sync_send(redisContext *c, const char *buf, size_t len)
{
    sync_cluster *k = sync_find(c);
    const char *argv[4];
    size_t lens[4];
    int argc = resp_args(buf, len, argv, lens), slot, port, kind, asking = 0;
    redisContext *to = c;
    redisReply *rep = NULL;
    char host[256];
    void *out;

    if (argc < 1)
        return NULL;
    slot = k ? cmd_slot(argc, argv, lens) : -1;
    if (k && slot >= 0 && k->slots[slot] && !(to = sync_node_ctx(k, k->slots[slot] - 1)))
        to = c; /* that master is not reachable: the seed redirects, or says why */
    for (int hop = 0; hop <= REDIRECTS_MAX; hop++) {
        if (asking) {
            out = NULL;
            if (redisAppendCommand(to, "ASKING") != REDIS_OK || redisGetReply(to, &out) != REDIS_OK)
                return NULL;
            freeReplyObject(out);
        }
        if (redisAppendFormattedCommand(to, buf, len) != REDIS_OK ||
            redisGetReply(to, &out) != REDIS_OK)
            return NULL;
        rep = out;
        if (!k || !(kind = redirect_parse(rep, &slot, host, sizeof(host), &port)))
            return rep;
        int i = sync_node_find(k, host, port);
        if (i < 0 || !(to = sync_node_ctx(k, i)))
            return rep;
        if (kind == 1)
            k->slots[slot] = (uint8_t)(i + 1);
        asking = kind == 2;
        freeReplyObject(rep);
        rep = NULL;
    }
    return rep;
}

redisReply *sf_redis_sync_vcmd(redisContext *c, const char *fmt, va_list ap)
{
    char *buf = NULL;
    int len = redisvFormatCommand(&buf, fmt, ap);
    redisReply *rep;

    if (len < 0)
        return NULL;
    rep = sync_send(c, buf, (size_t)len);
    redisFreeCommand(buf);
    return rep;
}

redisReply *sf_redis_sync_cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    redisReply *rep;

    va_start(ap, fmt);
    rep = sf_redis_sync_vcmd(c, fmt, ap);
    va_end(ap);
    return rep;
}

redisReply *sf_redis_sync_argv(redisContext *c, int argc, const char **argv,
                               const size_t *lens)
{
    char *buf = NULL;
    long long len = redisFormatCommandArgv(&buf, argc, argv, lens);
    redisReply *rep;

    if (len < 0)
        return NULL;
    rep = sync_send(c, buf, (size_t)len);
    redisFreeCommand(buf);
    return rep;
}

int sf_redis_sync_masters(redisContext *c, redisContext **out, int max)
{
    sync_cluster *k = sync_find(c);
    int n = 0;

    if (!k) {
        if (max < 1)
            return -ENOSPC;
        out[0] = c;
        return 1;
    }
    for (int i = 0; i < k->nnodes; i++) {
        int owns = 0;
        for (int s = 0; s < SF_REDIS_SLOTS && !owns; s++)
            owns = k->slots[s] == i + 1;
        if (!owns)
            continue;
        if (n == max)
            return -ENOSPC;
        if (!(out[n] = sync_node_ctx(k, i)))
            return -ENOTCONN;
        n++;
    }
    return n;
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
    char *data;        /* copies of the keys and args */
    redisReply *held;  /* the script's answer, while its WAIT travels */
} script_call;

static void script_call_free(script_call *sc)
{
    freeReplyObject(sc->held);
    free(sc->argv);
    free(sc->lens);
    free(sc->data);
    free(sc);
}

/* A deep copy of a reply (hiredis frees its own after the callback), freed by
 * freeReplyObject like hiredis's. */
static redisReply *reply_copy(const redisReply *r)
{
    redisReply *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->type = r->type;
    c->integer = r->integer;
    if (r->str) {
        if (!(c->str = malloc(r->len + 1))) {
            free(c);
            return NULL;
        }
        memcpy(c->str, r->str, r->len);
        c->str[r->len] = '\0';
        c->len = r->len;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
        if (!(c->element = calloc(r->elements, sizeof(*c->element)))) {
            freeReplyObject(c);
            return NULL;
        }
        c->elements = r->elements;
        for (size_t i = 0; i < r->elements; i++)
            if (!(c->element[i] = reply_copy(r->element[i]))) {
                freeReplyObject(c);
                return NULL;
            }
    }
    return c;
}

static void on_script_waited(redisAsyncContext *ac, void *r, void *priv)
{
    script_call *sc = priv;

    /* (whatever WAIT says, the script ran: a replica that did not answer in time does not
     * undo it; a connection lost meanwhile is answered as lost, as any reply in flight) */
    sc->cb(ac, r ? sc->held : NULL, sc->priv);
    script_call_free(sc);
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
    /* On a cluster a script's writes are on a replica before its caller hears of them: a
     * master lost to kill -9 right after does not take a record a client was told of with
     * it (its replica, promoted, has it). WAIT answers at once when the replica keeps up;
     * a master without replicas (one lost, not back yet) is not waited for. */
    if (rep && rep->type != REDIS_REPLY_ERROR && ac && ac->data) {
        rnode *n = ac->data;
        if (n->r->mode == MODE_CLUSTER && n->replicas > 0 && (sc->held = reply_copy(rep)) &&
            redisAsyncCommand(ac, on_script_waited, sc, "WAIT 1 %d", SF_REDIS_WAIT_MS) ==
                REDIS_OK)
            return;
        freeReplyObject(sc->held);
        sc->held = NULL;
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
    rep = sf_redis_sync_argv(c, n + 3, a, l);
    if (is_noscript(rep)) {
        freeReplyObject(rep);
        a[0] = "EVAL";
        a[1] = s->src;
        l[0] = 4;
        l[1] = strlen(s->src);
        rep = sf_redis_sync_argv(c, n + 3, a, l);
    }
    return rep;
}
