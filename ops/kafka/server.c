/* kb_server: the broker's server: the listener, request dispatch (header, version check,
 * the handler per API), ApiVersions and FindCoordinator, the group timer, statistics.
 * Connections are conn.c's; topics.c and records.c answer the topic and data APIs,
 * group.c the group APIs. */
#include "broker.h"
#include "sf_log.h"
#include "sf_util.h"

#include <errno.h>
#include <event2/listener.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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
        return KB_ANSWER;
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
    return KB_ANSWER;
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
    return KB_ANSWER;
}

/* ---- dispatch ---- */

static int api_supported(int16_t key, int16_t ver)
{
    for (size_t i = 0; i < KB_NAPIS; i++)
        if (kb_apis[i].key == key)
            return ver >= kb_apis[i].min && ver <= kb_apis[i].max;
    return 0;
}

/* The handlers that answer through w (the group APIs answer through group.c's reply). */
static kb_handler handler(int16_t key)
{
    switch (key) {
    case API_API_VERSIONS: return h_api_versions;
    case API_METADATA: return kb_h_metadata;
    case API_PRODUCE: return kb_h_produce;
    case API_FETCH: return kb_h_fetch;
    case API_LIST_OFFSETS: return kb_h_list_offsets;
    case API_FIND_COORDINATOR: return h_find_coordinator;
    case API_CREATE_TOPICS: return kb_h_create_topics;
    case API_DELETE_TOPICS: return kb_h_delete_topics;
    default: return NULL;
    }
}

/* A group API's request: answered through kb_conn_group_reply, now or later. */
static int group_request(kb_conn *c, int16_t key, kb_rbuf *r, const kb_req *req)
{
    kb_groups *gs = c->s->groups;
    int64_t now = sf_mono_ms();

    c->parked = 1;
    switch (key) {
    case API_JOIN_GROUP: return kb_group_join(gs, r, req, now);
    case API_SYNC_GROUP: return kb_group_sync(gs, r, req, now);
    case API_HEARTBEAT: return kb_group_heartbeat(gs, r, req, now);
    case API_LEAVE_GROUP: return kb_group_leave(gs, r, req, now);
    case API_OFFSET_COMMIT: return kb_group_offset_commit(gs, r, req, now);
    case API_OFFSET_FETCH: return kb_group_offset_fetch(gs, r, req, now);
    default: return -EPROTO;
    }
}

int kb_server_request(kb_conn *c, const uint8_t *p, size_t len)
{
    kb_server *s = c->s;
    kb_rbuf r;
    kb_req req;
    int16_t key;
    const char *cid;
    size_t cidn;
    kb_wbuf w;
    kb_handler h;
    int rc;

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
    if (key == API_API_VERSIONS && req.ver == 3)
        kb_r_tags(&r); /* request header v2 */
    if (key != API_API_VERSIONS && !api_supported(key, req.ver)) {
        sf_debug("msg=\"unsupported request; connection closed\" api=%d version=%d", key, req.ver);
        return -EPROTO;
    }
    if (!(h = handler(key)))
        return group_request(c, key, &r, &req);
    kb_w_init(&w, key == API_FETCH ? KB_FETCH_RESP_MAX : (16u << 20));
    rc = h(c, &r, &req, &w);
    if (rc >= 0 && w.err)
        rc = w.err;
    if (rc == KB_PARKED)
        c->parked = 1;
    else if (rc == KB_ANSWER)
        kb_conn_send(c, req.corr, &w);
    kb_w_fini(&w);
    return rc < 0 ? rc : 0;
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    kb_conn_new(arg, fd);
}

static void server_on_tick(evutil_socket_t fd, short what, void *arg)
{
    kb_server *s = arg;
    kb_groups_tick(s->groups, sf_mono_ms());
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
        !(s->groups = kb_groups_new(kb_conn_group_reply, s)) ||
        !(s->tick = event_new(base, -1, EV_PERSIST, server_on_tick, s)) ||
        !(s->wake = event_new(base, -1, 0, kb_fetches_wake, s))) {
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
        kb_conn_free(s->conns);
    if (s->lis)
        evconnlistener_free(s->lis);
    if (s->tick)
        event_free(s->tick);
    if (s->wake)
        event_free(s->wake);
    kb_groups_free(s->groups);
    kb_log_free(s->log);
    kb_rtopics_fini(&s->rt);
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
