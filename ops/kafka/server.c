#include "server.h"
#include "group.h"
#include "log.h"
#include "sf_log.h"
#include "sf_util.h"
#include "wire.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define KB_NODE_ID 1
#define KB_OUT_MAX (64u << 20)   /* a connection's unsent answers before it is read again */
#define KB_CONNS_MAX 4096
#define KB_TOPICS_MAX 16384
#define KB_FETCH_RESP_MAX (256u << 20)

enum { API_PRODUCE = 0, API_FETCH = 1, API_LIST_OFFSETS = 2, API_METADATA = 3,
       API_OFFSET_COMMIT = 8, API_OFFSET_FETCH = 9, API_FIND_COORDINATOR = 10,
       API_JOIN_GROUP = 11, API_HEARTBEAT = 12, API_LEAVE_GROUP = 13, API_SYNC_GROUP = 14,
       API_API_VERSIONS = 18, API_CREATE_TOPICS = 19, API_DELETE_TOPICS = 20, API_MAX = 21 };

enum { ERR_NONE = 0, ERR_OFFSET_OUT_OF_RANGE = 1, ERR_CORRUPT_MESSAGE = 2,
       ERR_UNKNOWN_TOPIC_OR_PARTITION = 3, ERR_INVALID_TOPIC = 17,
       ERR_RECORD_LIST_TOO_LARGE = 18, ERR_UNSUPPORTED_VERSION = 35,
       ERR_TOPIC_ALREADY_EXISTS = 36, ERR_INVALID_PARTITIONS = 37,
       ERR_INVALID_REPLICATION_FACTOR = 38, ERR_INVALID_REQUEST = 42,
       ERR_KAFKA_STORAGE = 56, ERR_INVALID_CONFIG = 40 };

/* What this broker implements: advertised as is in ApiVersions. */
static const struct {
    int16_t key, min, max;
} kb_apis[] = {
    {API_PRODUCE, 3, 7},        {API_FETCH, 4, 6},           {API_LIST_OFFSETS, 1, 2},
    {API_METADATA, 1, 4},       {API_OFFSET_COMMIT, 2, 3},   {API_OFFSET_FETCH, 1, 3},
    {API_FIND_COORDINATOR, 0, 2}, {API_JOIN_GROUP, 0, 3},    {API_HEARTBEAT, 0, 2},
    {API_LEAVE_GROUP, 0, 2},    {API_SYNC_GROUP, 0, 2},      {API_API_VERSIONS, 0, 3},
    {API_CREATE_TOPICS, 0, 4},  {API_DELETE_TOPICS, 0, 3},
};
#define KB_NAPIS (sizeof(kb_apis) / sizeof(kb_apis[0]))

typedef struct kb_conn kb_conn;

/* A Fetch waiting for data: its request is kept and evaluated again when data arrives. */
typedef struct kb_fetch {
    kb_conn *c;
    uint8_t *body; /* the request after its header */
    size_t len;
    kb_req req;
    struct event *timer;
    struct kb_fetch *prev, *next;
} kb_fetch;

struct kb_conn {
    kb_server *s;
    struct bufferevent *bev;
    struct event *resume;
    int parked;       /* a request waits for its answer: later ones wait */
    int dead;         /* to be closed by its next turn */
    kb_fetch *fetch;  /* that request, when it is a Fetch */
    kb_conn *prev, *next;
};

typedef struct kb_stats {
    long req[API_MAX];
    long fetch_now, fetch_woken, fetch_empty;
    long produced_batches, produced_bytes, fetched_bytes;
    long bytes_in, bytes_out, malformed, conns;
} kb_stats;

struct kb_server {
    struct event_base *base;
    kb_server_cfg cfg;
    struct evconnlistener *lis;
    struct event *tick, *wake;
    kb_log *log;
    kb_groups *groups;
    kb_conn *conns;
    long nconns;
    kb_fetch *fetches;
    kb_stats st;
    char cluster_id[40];  /* new at every start: clients tell a restarted broker by it */
};

static int64_t now_ms(void)
{
    return sf_mono_ms();
}

/* ---- connections ---- */

static void conn_free(kb_conn *c);
static void conn_process(kb_conn *c);

static void fetch_free(kb_fetch *f)
{
    kb_server *s;

    if (!f)
        return;
    s = f->c->s;
    if (f->prev)
        f->prev->next = f->next;
    else
        s->fetches = f->next;
    if (f->next)
        f->next->prev = f->prev;
    if (f->timer)
        event_free(f->timer);
    f->c->fetch = NULL;
    free(f->body);
    free(f);
}

static void conn_free(kb_conn *c)
{
    kb_server *s;

    if (!c)
        return;
    s = c->s;
    fetch_free(c->fetch);
    kb_groups_conn_gone(s->groups, c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    if (c->resume)
        event_free(c->resume);
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

/* Queues one answer: its size, the correlation id, body. */
static void conn_send(kb_conn *c, int32_t corr, const kb_wbuf *body)
{
    uint8_t hdr[8];
    size_t n = body->len + 4;
    struct evbuffer *out = bufferevent_get_output(c->bev);

    hdr[0] = (uint8_t)(n >> 24);
    hdr[1] = (uint8_t)(n >> 16);
    hdr[2] = (uint8_t)(n >> 8);
    hdr[3] = (uint8_t)n;
    hdr[4] = (uint8_t)((uint32_t)corr >> 24);
    hdr[5] = (uint8_t)((uint32_t)corr >> 16);
    hdr[6] = (uint8_t)((uint32_t)corr >> 8);
    hdr[7] = (uint8_t)corr;
    evbuffer_add(out, hdr, sizeof(hdr));
    evbuffer_add(out, body->p, body->len);
    c->s->st.bytes_out += (long)(n + 4);
}

/* An answer that came later (a group's or a waiting fetch's): the connection's next
 * requests run on the next loop turn. */
static void conn_answered(kb_conn *c)
{
    c->parked = 0;
    event_active(c->resume, EV_READ, 0);
}

static void group_reply(void *ctx, const kb_req *req, kb_wbuf *body)
{
    kb_conn *c = req->conn;

    if (body->err) { /* not within the bounds the group module checks */
        sf_warn("msg=\"a group answer did not fit; the client's connection is closed\"");
        c->dead = 1;
    } else {
        conn_send(c, req->corr, body);
    }
    conn_answered(c);
}

/* ---- ApiVersions ---- */

static int h_api_versions(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    int flexible = req->ver >= 3;

    if (req->ver > 3) { /* KIP-511: a v0 answer listing what is supported */
        kb_w_i16(w, ERR_UNSUPPORTED_VERSION);
        kb_w_i32(w, (int32_t)KB_NAPIS);
        for (size_t i = 0; i < KB_NAPIS; i++) {
            kb_w_i16(w, kb_apis[i].key);
            kb_w_i16(w, kb_apis[i].min);
            kb_w_i16(w, kb_apis[i].max);
        }
        return 0;
    }
    kb_w_i16(w, ERR_NONE);
    if (flexible)
        kb_w_uvarint(w, (uint32_t)KB_NAPIS + 1);
    else
        kb_w_i32(w, (int32_t)KB_NAPIS);
    for (size_t i = 0; i < KB_NAPIS; i++) {
        kb_w_i16(w, kb_apis[i].key);
        kb_w_i16(w, kb_apis[i].min);
        kb_w_i16(w, kb_apis[i].max);
        if (flexible)
            kb_w_uvarint(w, 0);
    }
    if (req->ver >= 1)
        kb_w_i32(w, 0);
    if (flexible)
        kb_w_uvarint(w, 0);
    return 0;
}

/* ---- topics ---- */

/* The topic, created with the default partition count when allowed and missing. *err gets
 * the error code for the caller's answer when there is none. */
static kb_topic *topic_get(kb_server *s, const char *name, size_t n, int create, int16_t *err)
{
    kb_topic *t = kb_log_find(s->log, name, n);
    int rc;

    *err = ERR_NONE;
    if (t)
        return t;
    if (kb_topic_name_check(name, n) < 0) {
        *err = ERR_INVALID_TOPIC;
        return NULL;
    }
    if (!create) {
        *err = ERR_UNKNOWN_TOPIC_OR_PARTITION;
        return NULL;
    }
    if ((rc = kb_log_create(s->log, name, n, s->cfg.auto_partitions, &t)) < 0 && rc != -EEXIST) {
        *err = ERR_UNKNOWN_TOPIC_OR_PARTITION;
        return NULL;
    }
    sf_info("msg=\"topic created on first use\" topic=%.*s partitions=%d", (int)n, name,
            (int)t->nparts);
    return t;
}

static void write_topic_meta(kb_server *s, kb_wbuf *w, int16_t ver, const char *name, size_t n,
                             const kb_topic *t, int16_t err)
{
    kb_w_i16(w, err);
    kb_w_str(w, name, n);
    kb_w_i8(w, 0); /* is_internal */
    kb_w_i32(w, t ? t->nparts : 0);
    for (int32_t p = 0; t && p < t->nparts; p++) {
        kb_w_i16(w, ERR_NONE);
        kb_w_i32(w, p);
        kb_w_i32(w, KB_NODE_ID);
        kb_w_i32(w, 1);
        kb_w_i32(w, KB_NODE_ID);
        kb_w_i32(w, 1);
        kb_w_i32(w, KB_NODE_ID);
    }
}

static int h_metadata(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    int32_t nt = kb_r_array(r, 1, KB_TOPICS_MAX, 2);
    size_t mark = r->off;
    int create = 1;

    for (int32_t i = 0; i < nt && !r->err; i++) {
        const char *name;
        size_t n;
        kb_r_str(r, 0, &name, &n);
    }
    if (req->ver >= 4)
        create = kb_r_i8(r) != 0;
    if (r->err)
        return r->err;
    if (req->ver >= 3)
        kb_w_i32(w, 0);
    kb_w_i32(w, 1); /* brokers: this one */
    kb_w_i32(w, KB_NODE_ID);
    kb_w_cstr(w, s->cfg.host);
    kb_w_i32(w, s->cfg.port);
    kb_w_str(w, NULL, 0); /* rack */
    if (req->ver >= 2)
        kb_w_cstr(w, s->cluster_id);
    kb_w_i32(w, KB_NODE_ID); /* controller */
    if (nt < 0) {
        kb_w_i32(w, (int32_t)s->log->n);
        for (size_t i = 0; i < s->log->n; i++) {
            const kb_topic *t = s->log->topics[i];
            write_topic_meta(s, w, req->ver, t->name, strlen(t->name), t, ERR_NONE);
        }
        return 0;
    }
    r->off = mark;
    kb_w_i32(w, nt);
    for (int32_t i = 0; i < nt; i++) {
        const char *name;
        size_t n;
        int16_t err;
        kb_topic *t;
        kb_r_str(r, 0, &name, &n);
        t = topic_get(s, name, n, create, &err);
        write_topic_meta(s, w, req->ver, name, n, t, err);
    }
    return 0;
}

static int h_create_topics(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    int32_t nt = kb_r_array(r, 0, 1024, 12);
    size_t mark = r->off;
    int validate_only = 0;

    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            if (r->err)
                return r->err;
            if (req->ver >= 2)
                kb_w_i32(w, 0);
            kb_w_i32(w, nt);
            r->off = mark;
        }
        for (int32_t i = 0; i < nt && !r->err; i++) {
            const char *name, *cn, *cv;
            size_t n, cnl, cvl;
            int32_t parts, na, nc;
            int16_t rf, err = ERR_NONE;
            const char *msg = NULL;
            kb_r_str(r, 0, &name, &n);
            parts = kb_r_i32(r);
            rf = kb_r_i16(r);
            na = kb_r_array(r, 0, 1024, 8);
            for (int32_t a = 0; a < na && !r->err; a++) {
                kb_r_i32(r);
                kb_r_skip(r, (size_t)kb_r_array(r, 0, 16, 4) * 4);
            }
            nc = kb_r_array(r, 0, 1024, 4);
            for (int32_t k = 0; k < nc && !r->err; k++) {
                kb_r_str(r, 0, &cn, &cnl);
                kb_r_str(r, 1, &cv, &cvl);
            }
            if (pass == 0)
                continue;
            if (parts == -1)
                parts = s->cfg.auto_partitions;
            if (kb_topic_name_check(name, n) < 0)
                err = ERR_INVALID_TOPIC, msg = "Topic names are 1-249 of [A-Za-z0-9._-].";
            else if (na > 0)
                err = ERR_INVALID_REQUEST, msg = "This broker places replicas itself.";
            else if (parts < 1 || parts > 1024)
                err = ERR_INVALID_PARTITIONS, msg = "Partitions must be 1-1024.";
            else if (rf != -1 && rf != 1)
                err = ERR_INVALID_REPLICATION_FACTOR, msg = "This broker has one node: replication factor 1.";
            else if (kb_log_find(s->log, name, n))
                err = ERR_TOPIC_ALREADY_EXISTS, msg = "The topic exists.";
            kb_w_str(w, name, n);
            kb_w_i16(w, err);
            if (req->ver >= 1)
                kb_w_str(w, msg, msg ? strlen(msg) : 0);
        }
        if (pass == 0) {
            kb_r_i32(r); /* timeout_ms */
            if (req->ver >= 1)
                validate_only = kb_r_i8(r) != 0;
        }
    }
    if (validate_only)
        return 0;
    /* the topics whose answer says ok are created now */
    r->off = mark;
    for (int32_t i = 0; i < nt; i++) {
        const char *name, *cn, *cv;
        size_t n, cnl, cvl;
        int32_t parts, na, nc;
        int16_t rf;
        kb_r_str(r, 0, &name, &n);
        parts = kb_r_i32(r);
        rf = kb_r_i16(r);
        na = kb_r_array(r, 0, 1024, 8);
        for (int32_t a = 0; a < na; a++) {
            kb_r_i32(r);
            kb_r_skip(r, (size_t)kb_r_array(r, 0, 16, 4) * 4);
        }
        nc = kb_r_array(r, 0, 1024, 4);
        for (int32_t k = 0; k < nc; k++) {
            kb_r_str(r, 0, &cn, &cnl);
            kb_r_str(r, 1, &cv, &cvl);
        }
        if (parts == -1)
            parts = s->cfg.auto_partitions;
        if (na == 0 && (rf == -1 || rf == 1) && kb_log_create(s->log, name, n, parts, NULL) == 0)
            sf_info("msg=\"topic created\" topic=%.*s partitions=%d", (int)n, name, (int)parts);
    }
    return 0;
}

static int h_delete_topics(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    int32_t nt = kb_r_array(r, 0, 1024, 2);
    size_t mark = r->off;

    for (int32_t i = 0; i < nt && !r->err; i++) {
        const char *name;
        size_t n;
        kb_r_str(r, 0, &name, &n);
    }
    kb_r_i32(r); /* timeout_ms */
    if (r->err)
        return r->err;
    r->off = mark;
    if (req->ver >= 1)
        kb_w_i32(w, 0);
    kb_w_i32(w, nt);
    for (int32_t i = 0; i < nt; i++) {
        const char *name;
        size_t n;
        int deleted;
        kb_r_str(r, 0, &name, &n);
        deleted = kb_log_delete(s->log, name, n) == 0;
        kb_w_str(w, name, n);
        kb_w_i16(w, deleted ? ERR_NONE : ERR_UNKNOWN_TOPIC_OR_PARTITION);
        if (deleted)
            sf_info("msg=\"topic deleted\" topic=%.*s", (int)n, name);
    }
    if (nt > 0)
        event_active(s->wake, EV_READ, 0); /* fetches waiting on them answer now */
    return 0;
}

/* ---- Produce ---- */

static int h_produce(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w, int *silent)
{
    kb_server *s = c->s;
    const char *txid;
    size_t txn, mark;
    int16_t acks;
    int32_t nt;
    int appended = 0;

    kb_r_str(r, 1, &txid, &txn);
    acks = kb_r_i16(r);
    kb_r_i32(r); /* timeout_ms */
    nt = kb_r_array(r, 0, KB_TOPICS_MAX, 6);
    mark = r->off;
    for (int32_t i = 0; i < nt && !r->err; i++) {
        const char *name;
        size_t n;
        int32_t np;
        kb_r_str(r, 0, &name, &n);
        np = kb_r_array(r, 0, 1024, 8);
        for (int32_t p = 0; p < np && !r->err; p++) {
            const uint8_t *recs;
            size_t rl;
            kb_r_i32(r);
            kb_r_bytes(r, 1, &recs, &rl);
        }
    }
    if (r->err)
        return r->err;
    r->off = mark;
    kb_w_i32(w, nt);
    for (int32_t i = 0; i < nt; i++) {
        const char *name;
        size_t n;
        int32_t np;
        int16_t terr;
        kb_topic *t;
        kb_r_str(r, 0, &name, &n);
        np = kb_r_array(r, 0, 1024, 8);
        t = topic_get(s, name, n, 1, &terr);
        kb_w_str(w, name, n);
        kb_w_i32(w, np);
        for (int32_t p = 0; p < np; p++) {
            int32_t part = kb_r_i32(r);
            const uint8_t *recs;
            size_t rl;
            int64_t base = -1;
            int16_t err = terr;
            int rc = 0;
            kb_r_bytes(r, 1, &recs, &rl);
            if (err == ERR_NONE && (part < 0 || part >= t->nparts))
                err = ERR_UNKNOWN_TOPIC_OR_PARTITION;
            if (err == ERR_NONE) {
                kb_part *kp = &t->parts[part];
                if (!recs || (rc = kb_part_append(kp, recs, rl, s->cfg.part_cap, &base)) == -EBADMSG)
                    err = ERR_CORRUPT_MESSAGE;
                else if (rc < 0)
                    err = ERR_KAFKA_STORAGE;
                else {
                    appended = 1;
                    s->st.produced_batches++;
                    s->st.produced_bytes += (long)rl;
                }
            }
            kb_w_i32(w, part);
            kb_w_i16(w, err);
            kb_w_i64(w, base);
            kb_w_i64(w, -1); /* log_append_time: create time is used */
            if (req->ver >= 5)
                kb_w_i64(w, err == ERR_NONE ? t->parts[part].start : -1);
        }
    }
    kb_w_i32(w, 0); /* throttle */
    if (appended && s->fetches)
        event_active(s->wake, EV_READ, 0);
    *silent = acks == 0;
    return 0;
}

/* ---- Fetch ---- */

/* Evaluates a Fetch: writes its answer into w and returns 1 when it should be answered now
 * (data enough, an error, or force), else 0; -EBADMSG when malformed. */
static int fetch_eval(kb_server *s, const uint8_t *body, size_t len, int16_t ver, int force,
                      kb_wbuf *w)
{
    kb_rbuf r;
    int32_t max_wait, min_bytes, max_bytes = INT32_MAX, nt;
    size_t mark;
    long avail = 0, left;
    int errors = 0, wrote_any = 0;

    kb_r_init(&r, body, len);
    kb_r_i32(&r); /* replica_id */
    max_wait = kb_r_i32(&r);
    min_bytes = kb_r_i32(&r);
    if (ver >= 3)
        max_bytes = kb_r_i32(&r);
    if (ver >= 4)
        kb_r_i8(&r); /* isolation_level */
    nt = kb_r_array(&r, 0, KB_TOPICS_MAX, 6);
    mark = r.off;
    if (min_bytes < 1)
        min_bytes = 1;
    for (int32_t i = 0; i < nt && !r.err; i++) {
        const char *name;
        size_t n;
        int32_t np;
        kb_topic *t;
        kb_r_str(&r, 0, &name, &n);
        np = kb_r_array(&r, 0, 1024, ver >= 5 ? 24 : 16);
        t = r.err ? NULL : kb_log_find(s->log, name, n);
        for (int32_t p = 0; p < np && !r.err; p++) {
            int32_t part = kb_r_i32(&r);
            int64_t off = kb_r_i64(&r);
            if (ver >= 5)
                kb_r_i64(&r);
            kb_r_i32(&r);
            if (!t || part < 0 || part >= t->nparts || off < t->parts[part].start ||
                off > t->parts[part].end)
                errors++;
            else if (off < t->parts[part].end && avail < min_bytes) {
                const kb_part *kp = &t->parts[part];
                long at = kb_part_locate(kp, off);
                for (size_t b = at < 0 ? kp->n : (size_t)at; b < kp->n && avail < min_bytes; b++)
                    avail += kp->b[b].len;
                if (at < 0 || avail == 0)
                    avail = 1;
            }
        }
    }
    if (r.err)
        return r.err;
    if (!force && !errors && max_wait > 0 && avail < min_bytes)
        return 0;
    r.off = mark;
    left = max_bytes > 0 ? max_bytes : 0;
    kb_w_i32(w, 0); /* throttle */
    kb_w_i32(w, nt);
    for (int32_t i = 0; i < nt; i++) {
        const char *name;
        size_t n;
        int32_t np;
        kb_topic *t;
        kb_r_str(&r, 0, &name, &n);
        np = kb_r_array(&r, 0, 1024, 16);
        t = kb_log_find(s->log, name, n);
        kb_w_str(w, name, n);
        kb_w_i32(w, np);
        for (int32_t p = 0; p < np; p++) {
            int32_t part = kb_r_i32(&r), pmax;
            int64_t off = kb_r_i64(&r);
            kb_part *kp = NULL;
            int16_t err = ERR_NONE;
            long at = -1;
            size_t lenpos;
            if (ver >= 5)
                kb_r_i64(&r);
            pmax = kb_r_i32(&r);
            if (!t || part < 0 || part >= t->nparts)
                err = ERR_UNKNOWN_TOPIC_OR_PARTITION;
            else if (off < (kp = &t->parts[part])->start || off > kp->end)
                err = ERR_OFFSET_OUT_OF_RANGE;
            else
                at = kb_part_locate(kp, off);
            kb_w_i32(w, part);
            kb_w_i16(w, err);
            kb_w_i64(w, kp ? kp->end : -1);
            kb_w_i64(w, kp ? kp->end : -1); /* last_stable_offset */
            if (ver >= 5)
                kb_w_i64(w, kp ? kp->start : -1);
            kb_w_i32(w, 0); /* aborted_transactions */
            lenpos = w->len;
            kb_w_i32(w, 0);
            if (at >= 0) {
                long plen = 0;
                for (size_t b = (size_t)at; b < kp->n; b++) {
                    const kb_batch *kb = &kp->b[b];
                    /* limits, except that the first batch of an answer always goes */
                    if (wrote_any && ((long)kb->len > left || plen + (long)kb->len > pmax))
                        break;
                    kb_w_raw(w, kb->data, kb->len);
                    plen += kb->len;
                    left -= kb->len;
                    wrote_any = 1;
                    if (left <= 0 || plen >= pmax)
                        break;
                }
                kb_w_put_i32_at(w, lenpos, (int32_t)plen);
                s->st.fetched_bytes += plen;
            }
        }
    }
    return w->err ? w->err : 1;
}

static void fetch_answer(kb_fetch *f, int force)
{
    kb_conn *c = f->c;
    kb_server *s = c->s;
    kb_wbuf w;
    int rc;

    kb_w_init(&w, KB_FETCH_RESP_MAX);
    rc = fetch_eval(s, f->body, f->len, f->req.ver, force, &w);
    if (rc == 1) {
        if (force)
            s->st.fetch_empty++; /* (its wait ended: whatever it has, usually nothing) */
        else
            s->st.fetch_woken++;
        conn_send(c, f->req.corr, &w);
        fetch_free(f);
        conn_answered(c);
    } else if (rc < 0) {
        conn_free(c);
    }
    kb_w_fini(&w);
}

static void fetch_on_timer(evutil_socket_t fd, short what, void *arg)
{
    fetch_answer(arg, 1);
}

/* Data arrived (or topics went): each waiting fetch is evaluated again. */
static void server_on_wake(evutil_socket_t fd, short what, void *arg)
{
    kb_server *s = arg;
    kb_fetch *f = s->fetches, *next;

    for (; f; f = next) {
        next = f->next;
        fetch_answer(f, 0);
    }
}

static int h_fetch(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w, int *parked)
{
    kb_server *s = c->s;
    const uint8_t *body = r->p + r->off;
    size_t len = r->len - r->off;
    int rc = fetch_eval(s, body, len, req->ver, 0, w);
    kb_fetch *f;
    int32_t max_wait;

    if (rc != 0) {
        if (rc == 1)
            s->st.fetch_now++;
        return rc < 0 ? rc : 0;
    }
    max_wait = kb_get_be32(body + 4); /* checked by fetch_eval */
    if (!(f = calloc(1, sizeof(*f))) || !(f->body = malloc(len))) {
        free(f);
        return -ENOMEM;
    }
    memcpy(f->body, body, len);
    f->len = len;
    f->req = *req;
    f->c = c;
    if (!(f->timer = evtimer_new(s->base, fetch_on_timer, f))) {
        free(f->body);
        free(f);
        return -ENOMEM;
    }
    {
        struct timeval tv = {max_wait / 1000, (max_wait % 1000) * 1000};
        evtimer_add(f->timer, &tv);
    }
    f->next = s->fetches;
    if (s->fetches)
        s->fetches->prev = f;
    s->fetches = f;
    c->fetch = f;
    *parked = 1;
    return 0;
}

/* ---- ListOffsets, FindCoordinator ---- */

static int h_list_offsets(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    int32_t nt;
    size_t mark;

    kb_r_i32(r); /* replica_id */
    if (req->ver >= 2)
        kb_r_i8(r);
    nt = kb_r_array(r, 0, KB_TOPICS_MAX, 6);
    mark = r->off;
    for (int32_t i = 0; i < nt && !r->err; i++) {
        const char *name;
        size_t n;
        int32_t np;
        kb_r_str(r, 0, &name, &n);
        np = kb_r_array(r, 0, 1024, 12);
        kb_r_skip(r, (size_t)np * 12);
    }
    if (r->err)
        return r->err;
    r->off = mark;
    if (req->ver >= 2)
        kb_w_i32(w, 0);
    kb_w_i32(w, nt);
    for (int32_t i = 0; i < nt; i++) {
        const char *name;
        size_t n;
        int32_t np;
        kb_topic *t;
        kb_r_str(r, 0, &name, &n);
        np = kb_r_array(r, 0, 1024, 12);
        t = kb_log_find(s->log, name, n);
        kb_w_str(w, name, n);
        kb_w_i32(w, np);
        for (int32_t p = 0; p < np; p++) {
            int32_t part = kb_r_i32(r);
            int64_t ts = kb_r_i64(r), off = -1;
            int16_t err = ERR_NONE;
            if (!t || part < 0 || part >= t->nparts)
                err = ERR_UNKNOWN_TOPIC_OR_PARTITION;
            else if (ts == -1)
                off = t->parts[part].end;
            else if (ts == -2)
                off = t->parts[part].start;
            else
                off = kb_part_offset_for_time(&t->parts[part], ts);
            kb_w_i32(w, part);
            kb_w_i16(w, err);
            kb_w_i64(w, -1); /* timestamp */
            kb_w_i64(w, off);
        }
    }
    return 0;
}

static int h_find_coordinator(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    const char *key;
    size_t n;

    kb_r_str(r, 0, &key, &n);
    if (req->ver >= 1)
        kb_r_i8(r); /* key_type: groups and transactions alike are coordinated here */
    if (r->err)
        return r->err;
    if (req->ver >= 1)
        kb_w_i32(w, 0);
    kb_w_i16(w, ERR_NONE);
    if (req->ver >= 1)
        kb_w_str(w, NULL, 0);
    kb_w_i32(w, KB_NODE_ID);
    kb_w_cstr(w, c->s->cfg.host);
    kb_w_i32(w, c->s->cfg.port);
    return 0;
}

/* ---- dispatch ---- */

static int api_supported(int16_t key, int16_t ver)
{
    for (size_t i = 0; i < KB_NAPIS; i++)
        if (kb_apis[i].key == key)
            return ver >= kb_apis[i].min && ver <= kb_apis[i].max;
    return 0;
}

/* Handles one request (its bytes after the size); 0, or -errno to close the connection. */
static int conn_request(kb_conn *c, const uint8_t *p, size_t len)
{
    kb_server *s = c->s;
    kb_rbuf r;
    kb_req req;
    int16_t key;
    const char *cid;
    size_t cidn;
    kb_wbuf w;
    int rc = 0, silent = 0, parked = 0;
    int64_t now = now_ms();

    kb_r_init(&r, p, len);
    key = kb_r_i16(&r);
    req.ver = kb_r_i16(&r);
    req.corr = kb_r_i32(&r);
    req.conn = c;
    kb_r_str(&r, 1, &cid, &cidn);
    if (r.err)
        return r.err;
    if (key >= 0 && key < API_MAX)
        s->st.req[key]++;
    if (key == API_API_VERSIONS && req.ver >= 3 && req.ver <= 3)
        kb_r_tags(&r); /* request header v2 */
    if (key != API_API_VERSIONS && !api_supported(key, req.ver)) {
        sf_debug("msg=\"unsupported request; connection closed\" api=%d version=%d", key, req.ver);
        return -EPROTO;
    }
    switch (key) {
    case API_JOIN_GROUP:
    case API_SYNC_GROUP:
    case API_HEARTBEAT:
    case API_LEAVE_GROUP:
    case API_OFFSET_COMMIT:
    case API_OFFSET_FETCH:
        /* answered through group_reply, now or later */
        c->parked = 1;
        switch (key) {
        case API_JOIN_GROUP: rc = kb_group_join(s->groups, &r, &req, now); break;
        case API_SYNC_GROUP: rc = kb_group_sync(s->groups, &r, &req, now); break;
        case API_HEARTBEAT: rc = kb_group_heartbeat(s->groups, &r, &req, now); break;
        case API_LEAVE_GROUP: rc = kb_group_leave(s->groups, &r, &req, now); break;
        case API_OFFSET_COMMIT: rc = kb_group_offset_commit(s->groups, &r, &req, now); break;
        default: rc = kb_group_offset_fetch(s->groups, &r, &req, now); break;
        }
        return rc;
    default:
        break;
    }
    kb_w_init(&w, key == API_FETCH ? KB_FETCH_RESP_MAX : (16u << 20));
    switch (key) {
    case API_API_VERSIONS: rc = h_api_versions(c, &r, &req, &w); break;
    case API_METADATA: rc = h_metadata(c, &r, &req, &w); break;
    case API_PRODUCE: rc = h_produce(c, &r, &req, &w, &silent); break;
    case API_FETCH: rc = h_fetch(c, &r, &req, &w, &parked); break;
    case API_LIST_OFFSETS: rc = h_list_offsets(c, &r, &req, &w); break;
    case API_FIND_COORDINATOR: rc = h_find_coordinator(c, &r, &req, &w); break;
    case API_CREATE_TOPICS: rc = h_create_topics(c, &r, &req, &w); break;
    case API_DELETE_TOPICS: rc = h_delete_topics(c, &r, &req, &w); break;
    default: rc = -EPROTO; break;
    }
    if (rc == 0 && w.err)
        rc = w.err;
    if (rc == 0 && parked)
        c->parked = 1;
    else if (rc == 0 && !silent)
        conn_send(c, req.corr, &w);
    kb_w_fini(&w);
    return rc;
}

static void conn_process(kb_conn *c)
{
    kb_server *s = c->s;
    struct evbuffer *in = bufferevent_get_input(c->bev);

    while (!c->parked || c->dead) {
        uint8_t hdr[4];
        size_t have = evbuffer_get_length(in);
        int32_t size;
        const uint8_t *p;
        int rc;

        if (c->dead) {
            conn_free(c);
            return;
        }
        if (have < 4)
            break;
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) > KB_OUT_MAX)
            break; /* the write callback resumes when the client read its answers */
        evbuffer_copyout(in, hdr, 4);
        size = kb_get_be32(hdr);
        if (size < 8 || (size_t)size > s->cfg.max_request) {
            s->st.malformed++;
            sf_info("msg=\"request size out of bounds; connection closed\" size=%d", (int)size);
            conn_free(c);
            return;
        }
        if (have < 4 + (size_t)size)
            break;
        if (!(p = evbuffer_pullup(in, 4 + (ssize_t)size))) {
            conn_free(c);
            return;
        }
        s->st.bytes_in += size + 4;
        if ((rc = conn_request(c, p + 4, (size_t)size)) < 0) {
            s->st.malformed++;
            sf_info("msg=\"malformed request; connection closed\" api=%d err=\"%s\"",
                    (int)(int16_t)((p[4] << 8) | p[5]), strerror(-rc));
            conn_free(c);
            return;
        }
        evbuffer_drain(in, 4 + (size_t)size);
        if (c->dead) {
            conn_free(c);
            return;
        }
    }
}

static void conn_on_read(struct bufferevent *bev, void *arg)
{
    conn_process(arg);
}

static void conn_on_write(struct bufferevent *bev, void *arg)
{
    kb_conn *c = arg;
    if (!c->parked && evbuffer_get_length(bufferevent_get_input(c->bev)) >= 4)
        conn_process(c);
}

static void conn_on_resume(evutil_socket_t fd, short what, void *arg)
{
    conn_process(arg);
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        conn_free(arg);
}

/* A connection on fd (owned from here on); NULL when refused (too many, no memory). */
static kb_conn *conn_new(kb_server *s, evutil_socket_t fd)
{
    kb_conn *c;
    int one = 1;

    if (s->nconns >= KB_CONNS_MAX || !(c = calloc(1, sizeof(*c)))) {
        evutil_closesocket(fd);
        return NULL;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->s = s;
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->resume = event_new(s->base, -1, 0, conn_on_resume, c);
    if (!c->bev || !c->resume) {
        if (c->bev)
            bufferevent_free(c->bev);
        else
            evutil_closesocket(fd);
        if (c->resume)
            event_free(c->resume);
        free(c);
        return NULL;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    s->st.conns++;
    bufferevent_setcb(c->bev, conn_on_read, conn_on_write, conn_on_event, c);
    /* a client that sends while its request waits is not read past one whole request */
    bufferevent_setwatermark(c->bev, EV_READ, 0, s->cfg.max_request + 4);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return c;
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    conn_new(arg, fd);
}

static void server_on_tick(evutil_socket_t fd, short what, void *arg)
{
    kb_server *s = arg;
    kb_groups_tick(s->groups, now_ms());
}

kb_server *kb_server_new(struct event_base *base, const kb_server_cfg *cfg, int fd)
{
    kb_server *s = calloc(1, sizeof(*s));
    struct timeval tick = {0, 100 * 1000};
    kb_topic *t;

    if (!s) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    s->base = base;
    s->cfg = *cfg;
    {
        uint8_t rnd[12];
        static const char hex[] = "0123456789abcdef";
        if (sf_random(rnd, sizeof(rnd)) < 0) {
            if (fd >= 0)
                close(fd);
            goto fail;
        }
        memcpy(s->cluster_id, "sandfleet-", 10);
        for (size_t i = 0; i < sizeof(rnd); i++) {
            s->cluster_id[10 + 2 * i] = hex[rnd[i] >> 4];
            s->cluster_id[11 + 2 * i] = hex[rnd[i] & 15];
        }
    }
    if (!(s->log = kb_log_new(KB_TOPICS_MAX, cfg->part_cap)) ||
        !(s->groups = kb_groups_new(group_reply, s)) ||
        !(s->tick = event_new(base, -1, EV_PERSIST, server_on_tick, s)) ||
        !(s->wake = event_new(base, -1, 0, server_on_wake, s))) {
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    if (fd >= 0 && !(s->lis = evconnlistener_new(base, on_accept, s, LEV_OPT_CLOSE_ON_FREE, -1,
                                                  fd))) {
        close(fd);
        goto fail;
    }
    if (kb_log_create(s->log, "sf.jobs", 7, cfg->partitions, &t) < 0 ||
        kb_log_create(s->log, "sf.dead", 7, 1, &t) < 0)
        goto fail;
    event_add(s->tick, &tick);
    return s;
fail:
    kb_server_free(s);
    errno = ENOMEM;
    return NULL;
}

void kb_server_free(kb_server *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_free(s->conns);
    if (s->lis)
        evconnlistener_free(s->lis);
    if (s->tick)
        event_free(s->tick);
    if (s->wake)
        event_free(s->wake);
    kb_groups_free(s->groups);
    kb_log_free(s->log);
    free(s);
}

void kb_server_log_stats(const kb_server *s)
{
    struct rusage ru;
    long groups, members, rebalances;
    const kb_stats *t = &s->st;

    getrusage(RUSAGE_SELF, &ru);
    kb_groups_stats(s->groups, &groups, &members, &rebalances);
    sf_info("msg=\"broker counts\" produce=%ld fetch=%ld fetch_answered_at_once=%ld "
            "fetch_woken_by_data=%ld fetch_ended_by_wait=%ld metadata=%ld join=%ld sync=%ld "
            "heartbeat=%ld commit=%ld offset_fetch=%ld list_offsets=%ld batches_in=%ld "
            "bytes_produced=%ld bytes_fetched=%ld bytes_in=%ld bytes_out=%ld connections=%ld "
            "malformed=%ld groups=%ld members=%ld rebalances=%ld cpu_user_ms=%ld cpu_sys_ms=%ld",
            t->req[API_PRODUCE], t->req[API_FETCH], t->fetch_now, t->fetch_woken, t->fetch_empty,
            t->req[API_METADATA], t->req[API_JOIN_GROUP], t->req[API_SYNC_GROUP],
            t->req[API_HEARTBEAT], t->req[API_OFFSET_COMMIT], t->req[API_OFFSET_FETCH],
            t->req[API_LIST_OFFSETS], t->produced_batches, t->produced_bytes, t->fetched_bytes,
            t->bytes_in, t->bytes_out, t->conns, t->malformed, groups, members, rebalances,
            ru.ru_utime.tv_sec * 1000L + ru.ru_utime.tv_usec / 1000,
            ru.ru_stime.tv_sec * 1000L + ru.ru_stime.tv_usec / 1000);
}
