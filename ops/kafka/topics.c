/* kb_topics: the broker's answers about topics: Metadata (creating a named topic on first
 * use when the client allows it), CreateTopics, DeleteTopics, and ListOffsets (a
 * partition's start, end, or first offset at a time). */
#include "broker.h"
#include "sf_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

kb_topic *kb_topic_get(kb_server *s, const char *name, size_t n, int create, int16_t *err)
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

/* ---- Metadata ---- */

static const kb_rtopics_spec names_spec = {.nullable = 1, .max_topics = KB_TOPICS_MAX,
                                           .topic_min = 2};

static void write_topic_meta(kb_wbuf *w, const char *name, size_t n, const kb_topic *t,
                             int16_t err)
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

int kb_h_metadata(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    kb_rtopics *rt = &s->rt;
    int create = 1, rc = kb_r_topics(r, &names_spec, req->ver, rt);

    if (req->ver >= 4)
        create = kb_r_i8(r) != 0;
    if (rc < 0 || (rc = r->err) < 0)
        goto out;
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
    if (rt->nt < 0) {
        kb_w_i32(w, (int32_t)s->log->n);
        for (size_t i = 0; i < s->log->n; i++) {
            const kb_topic *t = s->log->topics[i];
            write_topic_meta(w, t->name, strlen(t->name), t, ERR_NONE);
        }
        goto out;
    }
    kb_w_i32(w, rt->nt);
    for (int32_t i = 0; i < rt->nt; i++) {
        int16_t err;
        kb_topic *t = kb_topic_get(s, rt->t[i].name, rt->t[i].len, create, &err);
        write_topic_meta(w, rt->t[i].name, rt->t[i].len, t, err);
    }
out:
    kb_rtopics_done(rt);
    return rc < 0 ? rc : KB_ANSWER;
}

/* ---- CreateTopics, DeleteTopics ---- */

typedef struct create_topic {
    const char *name;
    size_t len;
    int32_t parts;
    int32_t nassign; /* replica assignments (refused: this broker places replicas itself) */
    int16_t rf;
} create_topic;

/* The topics of a CreateTopics request (*out, nt entries; calloc'd) and its
 * validate_only. 0, -EBADMSG or -ENOMEM. */
static int create_decode(kb_rbuf *r, int16_t ver, create_topic **out, int32_t *nt,
                         int *validate_only)
{
    create_topic *t = NULL;
    int32_t n = kb_r_array(r, 0, 1024, 12);

    if (n > 0 && !(t = calloc((size_t)n, sizeof(*t))))
        return -ENOMEM;
    *out = t;
    *nt = n;
    for (int32_t i = 0; i < n && !r->err; i++) {
        int32_t nc;
        kb_r_str(r, 0, &t[i].name, &t[i].len);
        t[i].parts = kb_r_i32(r);
        t[i].rf = kb_r_i16(r);
        t[i].nassign = kb_r_array(r, 0, 1024, 8);
        for (int32_t a = 0; a < t[i].nassign && !r->err; a++) {
            kb_r_i32(r); /* partition */
            kb_r_skip(r, (size_t)kb_r_array(r, 0, 16, 4) * 4);
        }
        nc = kb_r_array(r, 0, 1024, 4);
        for (int32_t k = 0; k < nc && !r->err; k++) { /* configs: checked, not kept */
            const char *cn, *cv;
            size_t cnl, cvl;
            kb_r_str(r, 0, &cn, &cnl);
            kb_r_str(r, 1, &cv, &cvl);
        }
    }
    kb_r_i32(r); /* timeout_ms */
    *validate_only = ver >= 1 && kb_r_i8(r) != 0;
    return r->err;
}

int kb_h_create_topics(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    create_topic *t = NULL;
    int32_t nt = 0;
    int validate_only = 0, rc = create_decode(r, req->ver, &t, &nt, &validate_only);

    if (rc < 0)
        goto out;
    if (req->ver >= 2)
        kb_w_i32(w, 0);
    kb_w_i32(w, nt);
    for (int32_t i = 0; i < nt; i++) {
        int32_t parts = t[i].parts == -1 ? s->cfg.auto_partitions : t[i].parts;
        int16_t err = ERR_NONE;
        const char *msg = NULL;
        if (kb_topic_name_check(t[i].name, t[i].len) < 0)
            err = ERR_INVALID_TOPIC, msg = "Topic names are 1-249 of [A-Za-z0-9._-].";
        else if (t[i].nassign > 0)
            err = ERR_INVALID_REQUEST, msg = "This broker places replicas itself.";
        else if (parts < 1 || parts > 1024)
            err = ERR_INVALID_PARTITIONS, msg = "Partitions must be 1-1024.";
        else if (t[i].rf != -1 && t[i].rf != 1)
            err = ERR_INVALID_REPLICATION_FACTOR, msg = "This broker has one node: replication factor 1.";
        else if (kb_log_find(s->log, t[i].name, t[i].len))
            err = ERR_TOPIC_ALREADY_EXISTS, msg = "The topic exists.";
        kb_w_str(w, t[i].name, t[i].len);
        kb_w_i16(w, err);
        if (req->ver >= 1)
            kb_w_str(w, msg, msg ? strlen(msg) : 0);
    }
    /* the topics whose answer says ok are created now (all answers first: a name twice in
     * one request is ok twice, and created once) */
    for (int32_t i = 0; i < nt && !validate_only; i++) {
        int32_t parts = t[i].parts == -1 ? s->cfg.auto_partitions : t[i].parts;
        if (t[i].nassign == 0 && (t[i].rf == -1 || t[i].rf == 1) &&
            kb_log_create(s->log, t[i].name, t[i].len, parts, NULL) == 0)
            sf_info("msg=\"topic created\" topic=%.*s partitions=%d", (int)t[i].len, t[i].name,
                    (int)parts);
    }
out:
    free(t);
    return rc < 0 ? rc : KB_ANSWER;
}

static const kb_rtopics_spec delete_spec = {.max_topics = 1024, .topic_min = 2};

int kb_h_delete_topics(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    kb_rtopics *rt = &s->rt;
    int rc = kb_r_topics(r, &delete_spec, req->ver, rt);

    kb_r_i32(r); /* timeout_ms */
    if (rc < 0 || (rc = r->err) < 0)
        goto out;
    if (req->ver >= 1)
        kb_w_i32(w, 0);
    kb_w_i32(w, rt->nt);
    for (int32_t i = 0; i < rt->nt; i++) {
        const char *name = rt->t[i].name;
        size_t n = rt->t[i].len;
        int deleted = kb_log_delete(s->log, name, n) == 0;
        kb_w_str(w, name, n);
        kb_w_i16(w, deleted ? ERR_NONE : ERR_UNKNOWN_TOPIC_OR_PARTITION);
        if (deleted)
            sf_info("msg=\"topic deleted\" topic=%.*s", (int)n, name);
    }
    if (rt->nt > 0)
        event_active(s->wake, EV_READ, 0); /* fetches waiting on them answer now */
out:
    kb_rtopics_done(rt);
    return rc < 0 ? rc : KB_ANSWER;
}

/* ---- ListOffsets ---- */

typedef struct list_part {
    int64_t ts; /* -1: the end, -2: the start, else the first offset at or after it */
    int32_t part;
} list_part;

static void list_part_read(kb_rbuf *r, int16_t ver, void *out)
{
    list_part *p = out;

    p->part = kb_r_i32(r);
    p->ts = kb_r_i64(r);
}

static const kb_rtopics_spec list_spec = {.max_topics = KB_TOPICS_MAX, .topic_min = 6,
                                          .part = list_part_read, .part_size = sizeof(list_part),
                                          .max_parts = 1024, .part_min = 12};

int kb_h_list_offsets(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w)
{
    kb_server *s = c->s;
    kb_rtopics *rt = &s->rt;
    int rc;

    kb_r_i32(r); /* replica_id */
    if (req->ver >= 2)
        kb_r_i8(r); /* isolation_level */
    if ((rc = kb_r_topics(r, &list_spec, req->ver, rt)) < 0)
        goto out;
    if (req->ver >= 2)
        kb_w_i32(w, 0);
    kb_w_i32(w, rt->nt);
    for (int32_t i = 0; i < rt->nt; i++) {
        const kb_rtopic *rtp = &rt->t[i];
        const list_part *lp = rt->parts;
        kb_topic *t = kb_log_find(s->log, rtp->name, rtp->len);
        kb_w_rtopic(w, rtp);
        for (int32_t p = 0; p < rtp->n; p++) {
            int32_t part = lp[rtp->first + (size_t)p].part;
            int64_t ts = lp[rtp->first + (size_t)p].ts, off = -1;
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
out:
    kb_rtopics_done(rt);
    return rc < 0 ? rc : KB_ANSWER;
}
