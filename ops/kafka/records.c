/* kb_records: record batches in and out. Produce appends each partition's batches (kept
 * as sent, see log.c); Fetch answers at once when a partition it names has data enough
 * (min_bytes) or an error, else waits (long poll): the parsed request is kept, evaluated
 * again whenever a produce brings data (or topics go), and answered then or when its
 * max_wait ends. */
#include "broker.h"
#include "sf_list.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- Produce ---- */

typedef struct produce_part {
    const uint8_t *recs; /* NULL: null records */
    uint32_t len;
    int32_t part;
} produce_part;

static void produce_part_read(kb_rbuf *r, int16_t ver, void *out)
{
    produce_part *p = out;
    size_t n;

    p->part = kb_r_i32(r);
    kb_r_bytes(r, 1, &p->recs, &n);
    p->len = (uint32_t)n; /* (an int32 length) */
}

static const kb_rtopics_spec produce_spec = {
    .max_topics = KB_TOPICS_MAX, .topic_min = 6, .part = produce_part_read,
    .part_size = sizeof(produce_part), .max_parts = 1024, .part_min = 8};

int kb_h_produce(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    const char *txid;
    size_t txn;
    int16_t acks;
    kb_rtopics *rt = &s->rt;
    const produce_part *pp;
    int rc, appended = 0;

    kb_r_str(r, 1, &txid, &txn);
    acks = kb_r_i16(r);
    kb_r_i32(r); /* timeout_ms */
    if ((rc = kb_r_topics(r, &produce_spec, req->ver, rt)) < 0)
        goto out;
    pp = rt->parts;
    kb_w_i32(w, rt->nt);
    for (int32_t i = 0; i < rt->nt; i++) {
        const kb_rtopic *rtp = &rt->t[i];
        int16_t terr;
        kb_topic *t = kb_topic_get(s, rtp->name, rtp->len, 1, &terr);
        kb_w_rtopic(w, rtp);
        for (int32_t p = 0; p < rtp->n; p++) {
            const produce_part *in = &pp[rtp->first + (size_t)p];
            int32_t part = in->part;
            int64_t base = -1;
            int16_t err = terr;
            int arc = 0;
            if (err == ERR_NONE && (part < 0 || part >= t->nparts))
                err = ERR_UNKNOWN_TOPIC_OR_PARTITION;
            if (err == ERR_NONE) {
                kb_part *kp = &t->parts[part];
                if (!in->recs ||
                    (arc = kb_part_append(kp, in->recs, in->len, s->cfg.part_cap, &base)) == -EBADMSG)
                    err = ERR_CORRUPT_MESSAGE;
                else if (arc < 0)
                    err = ERR_KAFKA_STORAGE;
                else {
                    appended = 1;
                    s->st.produced_batches++;
                    s->st.produced_bytes += (long)in->len;
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
out:
    kb_rtopics_done(rt);
    return rc < 0 ? rc : acks == 0 ? KB_SILENT : KB_ANSWER;
}

/* ---- Fetch ---- */

typedef struct fetch_part {
    int64_t offset;
    int32_t part;
    int32_t max_bytes;
} fetch_part;

typedef struct fetch_req {
    int32_t max_wait, min_bytes, max_bytes;
    kb_rtopics rt;
} fetch_req;

/* A Fetch waiting for data: its parsed request (names in its own copy of the body). */
struct kb_fetch {
    kb_conn *c;
    uint8_t *body;
    fetch_req fr;
    kb_req req;
    struct event *timer;
    kb_fetch *prev, *next;
};

static void fetch_part_read(kb_rbuf *r, int16_t ver, void *out)
{
    fetch_part *p = out;

    p->part = kb_r_i32(r);
    p->offset = kb_r_i64(r);
    if (ver >= 5)
        kb_r_i64(r); /* log_start_offset */
    p->max_bytes = kb_r_i32(r);
}

static const kb_rtopics_spec fetch_spec = {
    .max_topics = KB_TOPICS_MAX, .topic_min = 6, .part = fetch_part_read,
    .part_size = sizeof(fetch_part), .max_parts = 1024, .part_min = 16};
static const kb_rtopics_spec fetch_spec_v5 = {
    .max_topics = KB_TOPICS_MAX, .topic_min = 6, .part = fetch_part_read,
    .part_size = sizeof(fetch_part), .max_parts = 1024, .part_min = 24};

static int fetch_decode(kb_rbuf *r, int16_t ver, fetch_req *fr)
{
    kb_r_i32(r); /* replica_id */
    fr->max_wait = kb_r_i32(r);
    fr->min_bytes = kb_r_i32(r);
    fr->max_bytes = ver >= 3 ? kb_r_i32(r) : INT32_MAX;
    if (ver >= 4)
        kb_r_i8(r); /* isolation_level */
    if (fr->min_bytes < 1)
        fr->min_bytes = 1;
    return kb_r_topics(r, ver >= 5 ? &fetch_spec_v5 : &fetch_spec, ver, &fr->rt);
}

/* Whether a fetch is answered now: a partition it names has an error, or they have
 * min_bytes (a batch whose size is unknown, or an offset inside a batch, counts as enough). */
static int fetch_ready(const kb_server *s, const fetch_req *fr)
{
    const fetch_part *fp = fr->rt.parts;
    long avail = 0;

    for (int32_t i = 0; i < fr->rt.nt; i++) {
        const kb_rtopic *rtp = &fr->rt.t[i];
        const kb_topic *t = kb_log_find(s->log, rtp->name, rtp->len);
        for (int32_t p = 0; p < rtp->n; p++) {
            int32_t part = fp[rtp->first + (size_t)p].part;
            int64_t off = fp[rtp->first + (size_t)p].offset;
            const kb_part *kp;
            long at;
            if (!t || part < 0 || part >= t->nparts || off < t->parts[part].start ||
                off > t->parts[part].end)
                return 1;
            kp = &t->parts[part];
            if (off == kp->end || avail >= fr->min_bytes)
                continue;
            at = kb_part_locate(kp, off);
            for (size_t b = at < 0 ? kp->n : (size_t)at; b < kp->n && avail < fr->min_bytes; b++)
                avail += kp->b[b].len;
            if (at < 0 || avail == 0)
                avail = 1;
        }
    }
    return avail >= fr->min_bytes;
}

/* Writes a fetch's answer into w: 0, or w's error. */
static int fetch_write(kb_server *s, const fetch_req *fr, int16_t ver, kb_wbuf *w)
{
    const fetch_part *fp = fr->rt.parts;
    long left = fr->max_bytes > 0 ? fr->max_bytes : 0;
    int wrote_any = 0;

    kb_w_i32(w, 0); /* throttle */
    kb_w_i32(w, fr->rt.nt);
    for (int32_t i = 0; i < fr->rt.nt; i++) {
        const kb_rtopic *rtp = &fr->rt.t[i];
        kb_topic *t = kb_log_find(s->log, rtp->name, rtp->len);
        kb_w_rtopic(w, rtp);
        for (int32_t p = 0; p < rtp->n; p++) {
            int32_t part = fp[rtp->first + (size_t)p].part;
            int32_t pmax = fp[rtp->first + (size_t)p].max_bytes;
            int64_t off = fp[rtp->first + (size_t)p].offset;
            kb_part *kp = NULL;
            int16_t err = ERR_NONE;
            long at = -1;
            size_t lenpos;
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
    return w->err;
}

void kb_fetch_free(kb_fetch *f)
{
    if (!f)
        return;
    SF_LIST_UNLINK(f->c->s->fetches, f);
    if (f->timer)
        event_free(f->timer);
    f->c->fetch = NULL;
    kb_rtopics_fini(&f->fr.rt);
    free(f->body);
    free(f);
}

/* Answers a waiting fetch when it is ready, or (force) when its wait ended. */
static void fetch_answer(kb_fetch *f, int force)
{
    kb_conn *c = f->c;
    kb_server *s = c->s;
    kb_wbuf w;

    if (!force && !fetch_ready(s, &f->fr))
        return;
    kb_w_init(&w, KB_FETCH_RESP_MAX);
    if (fetch_write(s, &f->fr, f->req.ver, &w) < 0) {
        kb_conn_free(c);
    } else {
        if (force)
            s->st.fetch_empty++; /* (its wait ended: whatever it has, usually nothing) */
        else
            s->st.fetch_woken++;
        kb_conn_send(c, f->req.corr, &w);
        kb_fetch_free(f);
        kb_conn_answered(c);
    }
    kb_w_fini(&w);
}

static void fetch_on_timer(evutil_socket_t fd, short what, void *arg)
{
    fetch_answer(arg, 1);
}

void kb_fetches_wake(evutil_socket_t fd, short what, void *arg)
{
    kb_server *s = arg;
    kb_fetch *f = s->fetches, *next;

    for (; f; f = next) {
        next = f->next;
        fetch_answer(f, 0);
    }
}

/* The fetch waits: it keeps its request (body: the request's bytes that its names point
 * into) and a timer for its max_wait. */
static int fetch_park(kb_conn *c, fetch_req *fr, const kb_req *req, const uint8_t *body,
                      size_t len)
{
    kb_server *s = c->s;
    kb_fetch *f = calloc(1, sizeof(*f));
    struct timeval tv = {fr->max_wait / 1000, (fr->max_wait % 1000) * 1000};

    if (!f || !(f->body = malloc(len ? len : 1)) ||
        !(f->timer = evtimer_new(s->base, fetch_on_timer, f))) {
        if (f)
            free(f->body);
        free(f);
        return -ENOMEM;
    }
    memcpy(f->body, body, len);
    f->fr = *fr;
    kb_rtopics_rebase(&f->fr.rt, body, f->body, len);
    f->req = *req;
    f->c = c;
    evtimer_add(f->timer, &tv);
    SF_LIST_PUSH(s->fetches, f);
    c->fetch = f;
    return 0;
}

int kb_h_fetch(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    const uint8_t *body = r->p + r->off;
    size_t len = r->len - r->off;
    fetch_req fr;
    int rc;

    fr.rt = s->rt; /* (the server's arrays, given back below unless the fetch waits) */
    if ((rc = fetch_decode(r, req->ver, &fr)) < 0)
        goto out;
    if (fetch_ready(s, &fr) || fr.max_wait <= 0) {
        s->st.fetch_now++;
        rc = fetch_write(s, &fr, req->ver, w);
        goto out;
    }
    if ((rc = fetch_park(c, &fr, req, body, len)) < 0)
        goto out;
    memset(&s->rt, 0, sizeof(s->rt)); /* the waiting fetch has them */
    return KB_PARKED;
out:
    s->rt = fr.rt;
    kb_rtopics_done(&s->rt);
    return rc < 0 ? rc : KB_ANSWER;
}
