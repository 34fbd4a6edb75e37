#include "group.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_GROUPS_MAX 4096
#define KB_MEMBERS_MAX 1024
#define KB_PROTOS_MAX 16
#define KB_OFFSETS_MAX 16384
#define KB_ID_MAX 255          /* group and member ids */
#define KB_META_MAX (1 << 20)  /* a member's metadata, an assignment */
#define KB_OFFMETA_MAX 4096    /* a committed offset's metadata */

enum { ERR_NONE = 0, ERR_COORDINATOR_NOT_AVAILABLE = 15, ERR_ILLEGAL_GENERATION = 22,
       ERR_INCONSISTENT_GROUP_PROTOCOL = 23, ERR_INVALID_GROUP_ID = 24,
       ERR_UNKNOWN_MEMBER_ID = 25, ERR_INVALID_SESSION_TIMEOUT = 26,
       ERR_REBALANCE_IN_PROGRESS = 27, ERR_OFFSET_METADATA_TOO_LARGE = 12 };

enum { ST_EMPTY, ST_PREPARING, ST_COMPLETING, ST_STABLE };

typedef struct kb_proto {
    char *name;
    uint8_t *meta;
    size_t meta_len;
} kb_proto;

typedef struct kb_member {
    char id[KB_ID_MAX + 1];
    int32_t session_ms, rebalance_ms;
    char *type;
    kb_proto protos[KB_PROTOS_MAX];
    int nprotos;
    int64_t last_seen;
    int join_parked, sync_parked;
    kb_req join, sync;
    uint8_t *assign;
    size_t assign_len;
} kb_member;

typedef struct kb_offset {
    char *topic;
    int32_t part;
    int64_t offset;
    char *meta;
} kb_offset;

typedef struct kb_group {
    char id[KB_ID_MAX + 1];
    int state;
    int32_t gen;
    char proto[KB_ID_MAX + 1];
    char leader[KB_ID_MAX + 1];
    kb_member *m[KB_MEMBERS_MAX];
    int nm;
    int64_t join_deadline;
    kb_offset *offs;
    size_t noffs, offcap;
} kb_group;

struct kb_groups {
    kb_group **g;
    size_t n;
    kb_reply_fn reply;
    void *ctx;
    uint64_t next_member;
    uint32_t nonce;
    long rebalances;
    kb_rtopics rt;  /* the request being answered (its arrays reused) */
};

kb_groups *kb_groups_new(kb_reply_fn fn, void *ctx)
{
    kb_groups *gs = calloc(1, sizeof(*gs));

    if (!gs || !(gs->g = calloc(KB_GROUPS_MAX, sizeof(*gs->g)))) {
        free(gs);
        return NULL;
    }
    gs->reply = fn;
    gs->ctx = ctx;
    gs->nonce = (uint32_t)(uintptr_t)gs ^ (uint32_t)(uintptr_t)&gs;
    return gs;
}

static void protos_free(kb_proto *p, int n)
{
    for (int i = 0; i < n; i++) {
        free(p[i].name);
        free(p[i].meta);
    }
}

static void member_protos_free(kb_member *m)
{
    protos_free(m->protos, m->nprotos);
    m->nprotos = 0;
    free(m->type);
    m->type = NULL;
}

static void member_free(kb_member *m)
{
    if (!m)
        return;
    member_protos_free(m);
    free(m->assign);
    free(m);
}

static void group_free(kb_group *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->nm; i++)
        member_free(g->m[i]);
    for (size_t i = 0; i < g->noffs; i++) {
        free(g->offs[i].topic);
        free(g->offs[i].meta);
    }
    free(g->offs);
    free(g);
}

void kb_groups_free(kb_groups *gs)
{
    if (!gs)
        return;
    for (size_t i = 0; i < gs->n; i++)
        group_free(gs->g[i]);
    free(gs->g);
    kb_rtopics_fini(&gs->rt);
    free(gs);
}

void kb_groups_stats(const kb_groups *gs, long *groups, long *members, long *rebalances)
{
    long nm = 0;

    for (size_t i = 0; i < gs->n; i++)
        nm += gs->g[i]->nm;
    *groups = (long)gs->n;
    *members = nm;
    *rebalances = gs->rebalances;
}

static int str_eq(const char *a, const char *s, size_t n)
{
    return !strncmp(a, s, n) && a[n] == '\0';
}

static kb_group *group_find(kb_groups *gs, const char *id, size_t n)
{
    for (size_t i = 0; i < gs->n; i++)
        if (str_eq(gs->g[i]->id, id, n))
            return gs->g[i];
    return NULL;
}

/* The group, created when missing; NULL when the id is too long or the table is full. */
static kb_group *group_get(kb_groups *gs, const char *id, size_t n)
{
    kb_group *g = group_find(gs, id, n);

    if (g || n == 0 || n > KB_ID_MAX || gs->n >= KB_GROUPS_MAX)
        return g;
    if (!(g = calloc(1, sizeof(*g))))
        return NULL;
    memcpy(g->id, id, n);
    gs->g[gs->n++] = g;
    return g;
}

static int member_index(const kb_group *g, const char *id, size_t n)
{
    for (int i = 0; i < g->nm; i++)
        if (str_eq(g->m[i]->id, id, n))
            return i;
    return -1;
}

/* ---- answers ---- */

static void send(kb_groups *gs, const kb_req *req, kb_wbuf *w)
{
    if (req->conn)
        gs->reply(gs->ctx, req, w);
    kb_w_fini(w);
}

static void throttle(kb_wbuf *w, int16_t ver, int16_t from)
{
    if (ver >= from)
        kb_w_i32(w, 0);
}

static void join_error(kb_groups *gs, const kb_req *req, int16_t err, const char *member)
{
    kb_wbuf w;

    kb_w_init(&w, 1 << 16);
    throttle(&w, req->ver, 2);
    kb_w_i16(&w, err);
    kb_w_i32(&w, -1);
    kb_w_cstr(&w, "");
    kb_w_cstr(&w, "");
    kb_w_cstr(&w, member);
    kb_w_i32(&w, 0);
    send(gs, req, &w);
}

static void sync_answer(kb_groups *gs, const kb_req *req, int16_t err, const uint8_t *a, size_t n)
{
    kb_wbuf w;

    kb_w_init(&w, KB_META_MAX + 64);
    throttle(&w, req->ver, 1);
    kb_w_i16(&w, err);
    kb_w_bytes(&w, a ? a : (const uint8_t *)"", a ? n : 0);
    send(gs, req, &w);
}

static void error_only(kb_groups *gs, const kb_req *req, int16_t err, int16_t throttle_from)
{
    kb_wbuf w;

    kb_w_init(&w, 64);
    throttle(&w, req->ver, throttle_from);
    kb_w_i16(&w, err);
    send(gs, req, &w);
}

/* ---- the state machine ---- */

static void group_complete_join(kb_groups *gs, kb_group *g, int64_t now);

/* A rebalance starts: members waiting for their assignment are told to join again. */
static void group_prepare(kb_groups *gs, kb_group *g, int64_t now)
{
    int32_t wait = 0;

    if (g->state == ST_PREPARING)
        return;
    for (int i = 0; i < g->nm; i++) {
        kb_member *m = g->m[i];
        if (m->sync_parked) {
            m->sync_parked = 0;
            sync_answer(gs, &m->sync, ERR_REBALANCE_IN_PROGRESS, NULL, 0);
        }
        if (m->rebalance_ms > wait)
            wait = m->rebalance_ms;
    }
    g->state = ST_PREPARING;
    g->join_deadline = now + wait;
    gs->rebalances++;
}

static void group_check(kb_groups *gs, kb_group *g, int64_t now)
{
    int all = 1;

    if (g->state != ST_PREPARING)
        return;
    for (int i = 0; i < g->nm && all; i++)
        all = g->m[i]->join_parked;
    if (all || now >= g->join_deadline)
        group_complete_join(gs, g, now);
}

static void member_remove(kb_group *g, int i)
{
    member_free(g->m[i]);
    g->m[i] = g->m[--g->nm];
}

/* A member left or expired: the others rebalance without it. */
static void group_lost_member(kb_groups *gs, kb_group *g, int i, int64_t now)
{
    member_remove(g, i);
    if (g->nm == 0) {
        g->state = ST_EMPTY;
        g->gen++;
        g->leader[0] = '\0';
        return;
    }
    group_prepare(gs, g, now);
    group_check(gs, g, now);
}

static const kb_proto *member_proto(const kb_member *m, const char *name)
{
    for (int i = 0; i < m->nprotos; i++)
        if (!strcmp(m->protos[i].name, name))
            return &m->protos[i];
    return NULL;
}

static void group_complete_join(kb_groups *gs, kb_group *g, int64_t now)
{
    const char *chosen = NULL;

    for (int i = g->nm - 1; i >= 0; i--) /* who did not rejoin in time is out */
        if (!g->m[i]->join_parked)
            member_remove(g, i);
    if (g->nm == 0) {
        g->state = ST_EMPTY;
        g->gen++;
        g->leader[0] = '\0';
        return;
    }
    /* the first of the first member's protocols (in its order of preference) that every
     * member supports, with the same protocol type */
    for (int p = 0; p < g->m[0]->nprotos && !chosen; p++) {
        const char *name = g->m[0]->protos[p].name;
        int ok = 1;
        for (int i = 1; i < g->nm && ok; i++)
            ok = member_proto(g->m[i], name) && !strcmp(g->m[i]->type, g->m[0]->type);
        if (ok)
            chosen = name;
    }
    if (!chosen) {
        for (int i = g->nm - 1; i >= 0; i--) {
            g->m[i]->join_parked = 0;
            join_error(gs, &g->m[i]->join, ERR_INCONSISTENT_GROUP_PROTOCOL, g->m[i]->id);
            member_remove(g, i);
        }
        g->state = ST_EMPTY;
        g->gen++;
        return;
    }
    snprintf(g->proto, sizeof(g->proto), "%s", chosen);
    g->gen++;
    if (member_index(g, g->leader, strlen(g->leader)) < 0)
        snprintf(g->leader, sizeof(g->leader), "%s", g->m[0]->id);
    g->state = ST_COMPLETING;
    for (int i = 0; i < g->nm; i++) {
        kb_member *m = g->m[i];
        int lead = !strcmp(m->id, g->leader);
        kb_wbuf w;

        kb_w_init(&w, (size_t)KB_MEMBERS_MAX * (KB_META_MAX / 64) + (1 << 20));
        throttle(&w, m->join.ver, 2);
        kb_w_i16(&w, ERR_NONE);
        kb_w_i32(&w, g->gen);
        kb_w_cstr(&w, g->proto);
        kb_w_cstr(&w, g->leader);
        kb_w_cstr(&w, m->id);
        kb_w_i32(&w, lead ? g->nm : 0);
        for (int j = 0; lead && j < g->nm; j++) {
            const kb_proto *p = member_proto(g->m[j], g->proto);
            kb_w_cstr(&w, g->m[j]->id);
            kb_w_bytes(&w, p->meta ? p->meta : (const uint8_t *)"", p->meta_len);
        }
        m->join_parked = 0;
        m->last_seen = now;
        free(m->assign);
        m->assign = NULL;
        m->assign_len = 0;
        send(gs, &m->join, &w);
    }
}

/* ---- handlers ---- */

/* A name and its bytes (a member's protocol and metadata, a member and its assignment),
 * pointing into the request. */
typedef struct kb_pair {
    const char *name;
    size_t nlen;
    const uint8_t *b; /* NULL: null bytes */
    size_t blen;
} kb_pair;

/* An array of at most max pairs into out; its count (0 after an error). */
static int32_t read_pairs(kb_rbuf *r, int32_t max, kb_pair *out)
{
    int32_t n = kb_r_array(r, 0, max, 6);

    for (int32_t i = 0; i < n && !r->err; i++) {
        kb_r_str(r, 0, &out[i].name, &out[i].nlen);
        kb_r_bytes(r, 1, &out[i].b, &out[i].blen);
    }
    return r->err ? 0 : n;
}

int kb_group_join(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now)
{
    const char *gid, *mid, *type;
    size_t gn, mn, tn;
    int32_t session, rebalance, np;
    kb_pair pp[KB_PROTOS_MAX];
    kb_proto protos[KB_PROTOS_MAX];
    kb_group *g;
    kb_member *m = NULL;
    char *ntype = NULL;
    int i, nprotos = 0;

    kb_r_str(r, 0, &gid, &gn);
    session = kb_r_i32(r);
    rebalance = req->ver >= 1 ? kb_r_i32(r) : session;
    kb_r_str(r, 0, &mid, &mn);
    kb_r_str(r, 0, &type, &tn);
    np = read_pairs(r, KB_PROTOS_MAX, pp);
    if (r->err)
        return r->err;
    for (i = 0; i < np; i++) { /* the member's copies */
        if (pp[i].blen > KB_META_MAX)
            break;
        protos[i].name = strndup(pp[i].name, pp[i].nlen);
        protos[i].meta = pp[i].blen ? malloc(pp[i].blen) : NULL;
        protos[i].meta_len = pp[i].blen;
        nprotos++;
        if (!protos[i].name || (pp[i].blen && !protos[i].meta))
            break;
        if (pp[i].blen)
            memcpy(protos[i].meta, pp[i].b, pp[i].blen);
    }
    if (i < np) { /* no memory, or metadata over its bound */
        protos_free(protos, nprotos);
        join_error(gs, req, ERR_COORDINATOR_NOT_AVAILABLE, "");
        return 0;
    }
    {
        int16_t err = ERR_NONE;
        if (gn == 0 || gn > KB_ID_MAX || mn > KB_ID_MAX)
            err = ERR_INVALID_GROUP_ID;
        else if (session < 100 || session > 3600000 || rebalance < 0)
            err = ERR_INVALID_SESSION_TIMEOUT;
        else if (nprotos == 0 || tn == 0)
            err = ERR_INCONSISTENT_GROUP_PROTOCOL;
        else if (!(g = group_get(gs, gid, gn)))
            err = ERR_COORDINATOR_NOT_AVAILABLE;
        else if (mn > 0 && (i = member_index(g, mid, mn)) >= 0)
            m = g->m[i];
        else if (mn > 0)
            err = ERR_UNKNOWN_MEMBER_ID;
        else if (g->nm >= KB_MEMBERS_MAX || !(m = calloc(1, sizeof(*m))))
            err = ERR_COORDINATOR_NOT_AVAILABLE;
        else {
            snprintf(m->id, sizeof(m->id), "member-%llu-%08x",
                     (unsigned long long)++gs->next_member, gs->nonce);
            g->m[g->nm++] = m;
        }
        if (err == ERR_NONE && !(ntype = strndup(type, tn)))
            err = ERR_COORDINATOR_NOT_AVAILABLE;
        if (err != ERR_NONE) {
            protos_free(protos, nprotos);
            join_error(gs, req, err, "");
            return 0;
        }
    }
    /* the member's protocols are the ones it sent now */
    member_protos_free(m);
    m->type = ntype;
    memcpy(m->protos, protos, sizeof(kb_proto) * (size_t)nprotos);
    m->nprotos = nprotos;
    m->session_ms = session;
    m->rebalance_ms = rebalance;
    m->last_seen = now;
    if (m->join_parked) /* an earlier join on another connection */
        join_error(gs, &m->join, ERR_REBALANCE_IN_PROGRESS, m->id);
    m->join = *req;
    m->join_parked = 1;
    group_prepare(gs, g, now);
    group_check(gs, g, now);
    return 0;
}

int kb_group_sync(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now)
{
    const char *gid, *mid;
    size_t gn, mn;
    int32_t gen, na;
    kb_pair as[KB_MEMBERS_MAX]; /* the leader's assignments */
    kb_group *g;
    kb_member *m;
    int i;

    kb_r_str(r, 0, &gid, &gn);
    gen = kb_r_i32(r);
    kb_r_str(r, 0, &mid, &mn);
    na = read_pairs(r, KB_MEMBERS_MAX, as);
    if (r->err)
        return r->err;
    if (!(g = group_find(gs, gid, gn)) || (i = member_index(g, mid, mn)) < 0) {
        sync_answer(gs, req, ERR_UNKNOWN_MEMBER_ID, NULL, 0);
        return 0;
    }
    m = g->m[i];
    if (gen != g->gen) {
        sync_answer(gs, req, ERR_ILLEGAL_GENERATION, NULL, 0);
        return 0;
    }
    if (g->state == ST_PREPARING || g->state == ST_EMPTY) {
        sync_answer(gs, req, ERR_REBALANCE_IN_PROGRESS, NULL, 0);
        return 0;
    }
    m->last_seen = now;
    if (g->state == ST_STABLE) {
        sync_answer(gs, req, ERR_NONE, m->assign, m->assign_len);
        return 0;
    }
    if (m->sync_parked)
        sync_answer(gs, &m->sync, ERR_REBALANCE_IN_PROGRESS, NULL, 0);
    m->sync = *req;
    m->sync_parked = 1;
    if (strcmp(m->id, g->leader) != 0)
        return 0; /* waits for the leader's assignments */
    for (i = 0; i < na; i++) {
        kb_member *x;
        int j;
        if ((j = member_index(g, as[i].name, as[i].nlen)) < 0 || as[i].blen > KB_META_MAX)
            continue;
        x = g->m[j];
        free(x->assign);
        x->assign = NULL;
        x->assign_len = 0;
        if (as[i].blen && (x->assign = malloc(as[i].blen))) {
            memcpy(x->assign, as[i].b, as[i].blen);
            x->assign_len = as[i].blen;
        }
    }
    g->state = ST_STABLE;
    for (i = 0; i < g->nm; i++) {
        kb_member *x = g->m[i];
        if (x->sync_parked) {
            x->sync_parked = 0;
            x->last_seen = now;
            sync_answer(gs, &x->sync, ERR_NONE, x->assign, x->assign_len);
        }
    }
    return 0;
}

int kb_group_heartbeat(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now)
{
    const char *gid, *mid;
    size_t gn, mn;
    int32_t gen;
    kb_group *g;
    int i = -1;
    int16_t err = ERR_NONE;

    kb_r_str(r, 0, &gid, &gn);
    gen = kb_r_i32(r);
    kb_r_str(r, 0, &mid, &mn);
    if (r->err)
        return r->err;
    if (!(g = group_find(gs, gid, gn)) || (i = member_index(g, mid, mn)) < 0)
        err = ERR_UNKNOWN_MEMBER_ID;
    else if (g->state == ST_PREPARING)
        err = ERR_REBALANCE_IN_PROGRESS;
    else if (gen != g->gen)
        err = ERR_ILLEGAL_GENERATION;
    else
        g->m[i]->last_seen = now;
    if (g && i >= 0 && err == ERR_REBALANCE_IN_PROGRESS)
        g->m[i]->last_seen = now;
    error_only(gs, req, err, 1);
    return 0;
}

int kb_group_leave(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now)
{
    const char *gid, *mid;
    size_t gn, mn;
    kb_group *g;
    int i;

    kb_r_str(r, 0, &gid, &gn);
    kb_r_str(r, 0, &mid, &mn);
    if (r->err)
        return r->err;
    if (!(g = group_find(gs, gid, gn)) || (i = member_index(g, mid, mn)) < 0) {
        error_only(gs, req, ERR_UNKNOWN_MEMBER_ID, 1);
        return 0;
    }
    error_only(gs, req, ERR_NONE, 1);
    if (g->m[i]->join_parked) /* (its own join cannot be waiting: same connection) */
        join_error(gs, &g->m[i]->join, ERR_UNKNOWN_MEMBER_ID, "");
    group_lost_member(gs, g, i, now);
    return 0;
}

static kb_offset *offset_find(kb_group *g, const char *t, size_t tn, int32_t part)
{
    for (size_t i = 0; i < g->noffs; i++)
        if (g->offs[i].part == part && str_eq(g->offs[i].topic, t, tn))
            return &g->offs[i];
    return NULL;
}

/* 0, or an error code for this partition. */
static int16_t offset_store(kb_group *g, const char *t, size_t tn, int32_t part, int64_t off,
                            const char *meta, size_t metan)
{
    kb_offset *o = offset_find(g, t, tn, part);
    char *mcopy = NULL;

    if (metan > KB_OFFMETA_MAX)
        return ERR_OFFSET_METADATA_TOO_LARGE;
    if (meta && !(mcopy = strndup(meta, metan)))
        return ERR_COORDINATOR_NOT_AVAILABLE;
    if (!o) {
        if (g->noffs >= KB_OFFSETS_MAX || tn == 0 || tn > 249)
            goto fail;
        if (g->noffs == g->offcap) {
            size_t cap = g->offcap ? g->offcap * 2 : 16;
            kb_offset *n = realloc(g->offs, cap * sizeof(*n));
            if (!n)
                goto fail;
            g->offs = n;
            g->offcap = cap;
        }
        o = &g->offs[g->noffs];
        if (!(o->topic = strndup(t, tn)))
            goto fail;
        o->meta = NULL;
        o->part = part;
        g->noffs++;
    }
    o->offset = off;
    free(o->meta);
    o->meta = mcopy;
    return ERR_NONE;
fail:
    free(mcopy);
    return ERR_COORDINATOR_NOT_AVAILABLE;
}

typedef struct commit_part {
    int64_t offset;
    const char *meta; /* NULL: null metadata */
    size_t meta_len;
    int32_t part;
} commit_part;

static void commit_part_read(kb_rbuf *r, int16_t ver, void *out)
{
    commit_part *p = out;

    p->part = kb_r_i32(r);
    p->offset = kb_r_i64(r);
    kb_r_str(r, 1, &p->meta, &p->meta_len);
}

static const kb_rtopics_spec commit_spec = {
    .max_topics = 10000, .topic_min = 6, .part = commit_part_read,
    .part_size = sizeof(commit_part), .max_parts = 100000, .part_min = 14};

int kb_group_offset_commit(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now)
{
    const char *gid, *mid;
    size_t gn, mn;
    int32_t gen;
    kb_rtopics *rt = &gs->rt;
    const commit_part *cp;
    kb_group *g = NULL;
    int16_t gerr = ERR_NONE;
    kb_wbuf w;
    int i, rc;

    kb_r_str(r, 0, &gid, &gn);
    gen = kb_r_i32(r);
    kb_r_str(r, 0, &mid, &mn);
    kb_r_i64(r); /* retention_time_ms (v2-v4) */
    if ((rc = kb_r_topics(r, &commit_spec, req->ver, rt)) < 0) {
        kb_rtopics_done(rt);
        return rc;
    }
    if (gn == 0 || gn > KB_ID_MAX)
        gerr = ERR_INVALID_GROUP_ID;
    else if (!(g = group_get(gs, gid, gn)))
        gerr = ERR_COORDINATOR_NOT_AVAILABLE;
    else if (gen >= 0 || mn > 0) { /* a member's commit: checked against the group */
        if ((i = member_index(g, mid, mn)) < 0)
            gerr = ERR_UNKNOWN_MEMBER_ID;
        else if (gen != g->gen)
            gerr = ERR_ILLEGAL_GENERATION;
        else
            g->m[i]->last_seen = now;
    } else if (g->nm > 0) { /* a plain commit into a group whose members own its offsets */
        gerr = ERR_UNKNOWN_MEMBER_ID;
    }
    cp = rt->parts;
    kb_w_init(&w, 64u << 20);
    throttle(&w, req->ver, 3);
    kb_w_i32(&w, rt->nt);
    for (int32_t t = 0; t < rt->nt; t++) {
        const kb_rtopic *rtp = &rt->t[t];
        kb_w_rtopic(&w, rtp);
        for (int32_t p = 0; p < rtp->n; p++) {
            const commit_part *c = &cp[rtp->first + (size_t)p];
            kb_w_i32(&w, c->part);
            kb_w_i16(&w, gerr != ERR_NONE ? gerr
                                          : offset_store(g, rtp->name, rtp->len, c->part,
                                                         c->offset, c->meta, c->meta_len));
        }
    }
    kb_rtopics_done(rt);
    send(gs, req, &w);
    return 0;
}

static void fetch_part_read(kb_rbuf *r, int16_t ver, void *out)
{
    *(int32_t *)out = kb_r_i32(r);
}

static const kb_rtopics_spec offset_fetch_spec = {
    .max_topics = 10000, .topic_min = 6, .part = fetch_part_read, .part_size = sizeof(int32_t),
    .max_parts = 100000, .part_min = 4};
static const kb_rtopics_spec offset_fetch_spec_v2 = { /* a null array: every offset */
    .nullable = 1, .max_topics = 10000, .topic_min = 6, .part = fetch_part_read,
    .part_size = sizeof(int32_t), .max_parts = 100000, .part_min = 4};

int kb_group_offset_fetch(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now)
{
    const char *gid;
    size_t gn;
    kb_rtopics *rt = &gs->rt;
    const int32_t *parts;
    kb_group *g;
    kb_wbuf w;
    int rc;

    kb_r_str(r, 0, &gid, &gn);
    rc = kb_r_topics(r, req->ver >= 2 ? &offset_fetch_spec_v2 : &offset_fetch_spec, req->ver, rt);
    if (rc < 0) {
        kb_rtopics_done(rt);
        return rc;
    }
    g = group_find(gs, gid, gn);
    parts = rt->parts;
    kb_w_init(&w, 64u << 20);
    throttle(&w, req->ver, 3);
    if (rt->nt < 0) { /* all of the group's offsets, one topic entry per partition */
        kb_w_i32(&w, g ? (int32_t)g->noffs : 0);
        for (size_t i = 0; g && i < g->noffs; i++) {
            kb_w_cstr(&w, g->offs[i].topic);
            kb_w_i32(&w, 1);
            kb_w_i32(&w, g->offs[i].part);
            kb_w_i64(&w, g->offs[i].offset);
            kb_w_cstr(&w, g->offs[i].meta);
            kb_w_i16(&w, ERR_NONE);
        }
    } else {
        kb_w_i32(&w, rt->nt);
        for (int32_t t = 0; t < rt->nt; t++) {
            const kb_rtopic *rtp = &rt->t[t];
            kb_w_rtopic(&w, rtp);
            for (int32_t p = 0; p < rtp->n; p++) {
                int32_t part = parts[rtp->first + (size_t)p];
                kb_offset *o = g ? offset_find(g, rtp->name, rtp->len, part) : NULL;
                kb_w_i32(&w, part);
                kb_w_i64(&w, o ? o->offset : -1);
                kb_w_cstr(&w, o ? o->meta : "");
                kb_w_i16(&w, ERR_NONE);
            }
        }
    }
    if (req->ver >= 2)
        kb_w_i16(&w, ERR_NONE);
    kb_rtopics_done(rt);
    send(gs, req, &w);
    return 0;
}

void kb_groups_tick(kb_groups *gs, int64_t now)
{
    for (size_t k = 0; k < gs->n; k++) {
        kb_group *g = gs->g[k];
        for (int i = g->nm - 1; i >= 0; i--) {
            kb_member *m = g->m[i];
            if (!m->join_parked && !m->sync_parked && now - m->last_seen > m->session_ms) {
                group_lost_member(gs, g, i, now);
                i = g->nm; /* the array changed: start over */
            }
        }
        group_check(gs, g, now);
    }
}

void kb_groups_conn_gone(kb_groups *gs, void *conn)
{
    for (size_t k = 0; k < gs->n; k++) {
        kb_group *g = gs->g[k];
        for (int i = 0; i < g->nm; i++) {
            kb_member *m = g->m[i];
            if (m->join_parked && m->join.conn == conn) /* its session runs from its join */
                m->join_parked = 0;
            if (m->sync_parked && m->sync.conn == conn)
                m->sync_parked = 0;
        }
    }
}
