/* ingress.c: the worker's preview ingress (ingress.h; docs/internals/ingress.md). */
#include "ingress.h"
#include "sf_bev.h"
#include "sf_list.h"
#include "sf_map.h"
#include "sf_msg.h"
#include "sf_pvtoken.h"
#include "sf_splice.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TEAMS_MAX 4096 /* teams counted; the rest go under "_other" */
#define LOCAL_EARLY_MAX (64u << 10) /* a relay's bytes behind its answer, passed with the fd */
#define LOCAL_REPORT_MAX 128 /* a local hop's byte report line */
#define LINGER_MS 2000 /* a refused client's bytes are read and dropped this long */
#define MSG_FULL "The ingress is at its connection limit; retry in a few seconds."
#define MSG_NOTHING_LISTENS_FMT                                                                \
    "Nothing in sandbox %s listens on port %u yet; start the server with sandbox_exec."

enum { HOP_LINE, HOP_OPENING, HOP_CONNECTING, HOP_PUMP, HOP_LOCAL, HOP_CLOSING };

typedef struct team_bytes {
    uint64_t in, out;
} team_bytes;

typedef struct sb_count {
    uint32_t n;
} sb_count;

struct wk_hop {
    wk_ingress *ing;
    wk_hop *prev, *next;
    int phase;
    int client_gone;          /* the client's side ended before the daemon answered */
    struct bufferevent *bc;   /* the gateway's side */
    struct bufferevent *bs;   /* the sandbox's side */
    struct event *ev_open;    /* the daemon's deadline */
    char id[SF_ID_MAX];
    unsigned port;
    char team[SF_ID_MAX];
    int counted;              /* in the sandbox's count */
    int relay;                /* the sandbox's side is a relay: its answer line first */
    int local;                /* came over the local socket: the sandbox's socket is passed */
    sf_splice *up, *down;     /* the pump: client -> sandbox, sandbox -> client */
    int shut_c, shut_s;       /* that side's FIN was passed on (shutdown(SHUT_WR) of the other) */
    size_t ok_left;           /* bytes of our "SFHOP1 OK\n" not yet written (not counted) */
    uint64_t in, out;         /* bytes moved, not yet added to the team's counters */
};

struct wk_ingress {
    wk_ingress_cfg cfg;
    uint8_t key[32];
    struct evconnlistener *lis;
    char addr[64];
    struct evconnlistener *llis; /* the local hop's unix socket, or NULL */
    int ldir;                    /* its folder (O_PATH), or -1 */
    char lpath[256];
    uint64_t nlocal;
    wk_hop *hops;
    uint32_t nhops;
    sf_map *per_sb;           /* id -> sb_count */
    sf_map *teams;            /* team -> team_bytes */
    /* the replay cache: a ring in arrival order, and its nonces */
    struct nonce_ent {
        char nonce[SF_PV_NONCE_HEX + 1];
        int64_t until_ms;
    } *ring;
    uint32_t ring_head, ring_len;
    sf_map *nonces;
};

/* ---- counters ---- */

static void team_add(wk_ingress *ing, const char *team, uint64_t in, uint64_t out)
{
    team_bytes *t;

    if (!team[0] || (in == 0 && out == 0))
        return;
    if (!(t = sf_map_get(ing->teams, team))) {
        if (sf_map_len(ing->teams) >= TEAMS_MAX - 1)
            team = "_other";
        if (!(t = sf_map_get(ing->teams, team))) {
            if (!(t = calloc(1, sizeof(*t))))
                return;
            if (sf_map_put(ing->teams, team, t) < 0) {
                free(t);
                return;
            }
        }
    }
    t->in += in;
    t->out += out;
}

static void hop_flush_bytes(wk_hop *h)
{
    team_add(h->ing, h->team, h->in, h->out);
    h->in = h->out = 0;
}

/* ---- a hop's end ---- */

static void hop_free(wk_hop *h)
{
    wk_ingress *ing = h->ing;

    hop_flush_bytes(h);
    if (h->counted) {
        sb_count *c = sf_map_get(ing->per_sb, h->id);
        if (c && --c->n == 0)
            free(sf_map_del(ing->per_sb, h->id));
    }
    /* the splices' events first: the bufferevents close the sockets */
    sf_splice_free(h->up);
    sf_splice_free(h->down);
    if (h->bc)
        bufferevent_free(h->bc);
    if (h->bs)
        bufferevent_free(h->bs);
    if (h->ev_open)
        event_free(h->ev_open);
    SF_LIST_UNLINK(ing->hops, h);
    ing->nhops--;
    free(h);
}

/* The client's side is done with (the daemon still owes its answer: h waits for it). */
static void hop_end(wk_hop *h)
{
    if (h->phase == HOP_OPENING) {
        h->client_gone = 1;
        if (h->bc) {
            bufferevent_free(h->bc);
            h->bc = NULL;
        }
        return;
    }
    hop_free(h);
}

static void on_closing_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    hop_end(arg);
}

static void on_closing_drain(struct bufferevent *bev, void *arg)
{
    (void)arg;
    evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
}

/* The refusal is out: a lingering close (our side shut, what the client still sends read
 * and dropped until it closes, LINGER_MS at most). Closing with its bytes unread would send a
 * reset, which can reach the client before it read the ERR line (an overlong line). */
static void on_closing_written(struct bufferevent *bev, void *arg)
{
    struct timeval tv = {LINGER_MS / 1000, (LINGER_MS % 1000) * 1000};

    if (shutdown(bufferevent_getfd(bev), SHUT_WR) < 0) {
        hop_end(arg);
        return;
    }
    evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
    bufferevent_setwatermark(bev, EV_READ, 0, 0);
    bufferevent_setcb(bev, on_closing_drain, NULL, on_closing_event, arg);
    bufferevent_set_timeouts(bev, &tv, NULL);
    bufferevent_enable(bev, EV_READ);
}


/* Answers the client `SFHOP1 ERR <status> <why>` and closes once it is written. */
static void hop_refuse(wk_hop *h, int status, const char *why)
{
    h->phase = HOP_CLOSING;
    if (h->bs) {
        bufferevent_free(h->bs);
        h->bs = NULL;
    }
    if (h->client_gone || !h->bc) {
        hop_free(h);
        return;
    }
    bufferevent_disable(h->bc, EV_READ);
    sf_bev_no_timeouts(h->bc);
    evbuffer_drain(bufferevent_get_input(h->bc), evbuffer_get_length(bufferevent_get_input(h->bc)));
    if (evbuffer_add_printf(bufferevent_get_output(h->bc), "SFHOP1 ERR %d %s\n", status,
                            why) < 0) {
        hop_free(h);
        return;
    }
    bufferevent_setwatermark(h->bc, EV_WRITE, 0, 0);
    bufferevent_setcb(h->bc, NULL, on_closing_written, on_closing_event, h);
    bufferevent_enable(h->bc, EV_WRITE);
}

/* ---- the pump: two splices (sf_splice.h), the sockets kept by their bufferevents ---- */

static void pump_moved_in(void *arg, size_t n)
{
    wk_hop *h = arg;

    h->in += n;
    if (h->in + h->out >= (1u << 20))
        hop_flush_bytes(h);
}

static void pump_moved_out(void *arg, size_t n)
{
    wk_hop *h = arg;
    size_t skip = n < h->ok_left ? n : h->ok_left; /* our own "SFHOP1 OK\n" is no traffic */

    h->ok_left -= skip;
    h->out += n - skip;
    if (h->in + h->out >= (1u << 20))
        hop_flush_bytes(h);
}

/* One way ended: its FIN was passed on (0), or a side failed (a reset ends both). */
static void pump_done_in(void *arg, int err)
{
    wk_hop *h = arg;

    h->shut_c = 1;
    if (err < 0 || h->shut_s)
        hop_free(h);
}

static void pump_done_out(void *arg, int err)
{
    wk_hop *h = arg;

    h->shut_s = 1;
    if (err < 0 || h->shut_c)
        hop_free(h);
}

static void local_pass(wk_hop *h);
static void refuse_not_listening(wk_hop *h);

static void pump_start(wk_hop *h)
{
    struct evbuffer *ok = evbuffer_new();
    sf_splice_cfg up = {.base = h->ing->cfg.base,
                        .src = bufferevent_getfd(h->bc),
                        .dst = bufferevent_getfd(h->bs),
                        .cap = h->ing->cfg.buf_max,
                        .shut_dst = 1,
                        .moved = pump_moved_in,
                        .done = pump_done_in,
                        .arg = h};
    sf_splice_cfg down = up;

    if (h->local) {
        if (ok)
            evbuffer_free(ok);
        local_pass(h);
        return;
    }
    down.src = up.dst;
    down.dst = up.src;
    down.moved = pump_moved_out;
    down.done = pump_done_out;
    h->phase = HOP_PUMP;
    /* the bufferevents keep their sockets (closed with them) and do nothing more; the line's
     * deadline ends here for good: a hop may be silent as long as its ends like */
    sf_bev_no_timeouts(h->bc);
    sf_bev_no_timeouts(h->bs);
    bufferevent_disable(h->bc, EV_READ | EV_WRITE);
    bufferevent_disable(h->bs, EV_READ | EV_WRITE);
    bufferevent_setcb(h->bc, NULL, NULL, NULL, NULL);
    bufferevent_setcb(h->bs, NULL, NULL, NULL, NULL);
    h->ok_left = strlen("SFHOP1 OK\n");
    if (!ok || evbuffer_add(ok, "SFHOP1 OK\n", h->ok_left) < 0 ||
        sf_splice_new(&up, &h->up) < 0 || sf_splice_new(&down, &h->down) < 0 ||
        /* what the client sent behind its line goes first, and what a relay sent behind
         * its answer (after our OK) */
        sf_splice_prepend(h->up, bufferevent_get_input(h->bc)) < 0 ||
        evbuffer_add_buffer(ok, bufferevent_get_input(h->bs)) < 0 ||
        sf_splice_prepend(h->down, ok) < 0) {
        if (ok)
            evbuffer_free(ok);
        hop_refuse(h, 503, SF_MSG_HOST_NOMEM);
        return;
    }
    evbuffer_free(ok);
    sf_splice_start(h->up);
    sf_splice_start(h->down);
}

/* ---- the local hop: the socket passed, the byte reports read until the gateway closes ---- */

/* The gateway's report lines, "SFHOP1 BYTES <in> <out>\n" (bytes it moved since its last
 * report); anything else ends the hop. */
static void on_local_read(struct bufferevent *bev, void *arg)
{
    wk_hop *h = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    for (;;) {
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_LF);
        char line[LOCAL_REPORT_MAX + 1], *a, *b;
        int64_t vi, vo;

        if (eol.pos < 0) {
            if (evbuffer_get_length(in) > LOCAL_REPORT_MAX)
                hop_free(h);
            return;
        }
        if ((size_t)eol.pos > LOCAL_REPORT_MAX) {
            hop_free(h);
            return;
        }
        evbuffer_remove(in, line, (size_t)eol.pos + 1);
        line[eol.pos] = '\0';
        a = line + 13;
        if (strncmp(line, "SFHOP1 BYTES ", 13) != 0 || !(b = strchr(a, ' '))) {
            hop_free(h);
            return;
        }
        *b++ = '\0';
        if (sf_parse_i64(a, 0, INT64_C(1) << 50, &vi) < 0 ||
            sf_parse_i64(b, 0, INT64_C(1) << 50, &vo) < 0) {
            hop_free(h);
            return;
        }
        h->in += (uint64_t)vi;
        h->out += (uint64_t)vo;
        if (h->in + h->out >= (1u << 20))
            hop_flush_bytes(h);
    }
}

/* The gateway closed (its relay ended, or it died): the hop's count ends with it. */
static void on_local_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    hop_free(arg);
}

/* The hop checked out and the sandbox's side is connected (a relay answered): the gateway
 * gets `SFHOP1 OK <n>\n`, the n bytes a relay sent behind its answer, and the socket
 * (SCM_RIGHTS, with the line's first byte). The worker keeps its own reference (bs, idle)
 * for wk_ingress_drop's shutdown(). */
static void local_pass(wk_hop *h)
{
    struct evbuffer *early = bufferevent_get_input(h->bs);
    size_t n = evbuffer_get_length(early), total;
    char *buf;
    int hn, sfd = bufferevent_getfd(h->bs);
    struct iovec iov;
    struct msghdr m;
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    struct cmsghdr *c;
    ssize_t w;

    if (n > LOCAL_EARLY_MAX) {
        refuse_not_listening(h);
        return;
    }
    if (!(buf = malloc(32 + n))) {
        hop_refuse(h, 503, SF_MSG_HOST_NOMEM);
        return;
    }
    hn = snprintf(buf, 32, "SFHOP1 OK %zu\n", n);
    evbuffer_remove(early, buf + hn, n);
    total = (size_t)hn + n;
    memset(&m, 0, sizeof(m));
    memset(&cm, 0, sizeof(cm));
    iov.iov_base = buf;
    iov.iov_len = total;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cm.b;
    m.msg_controllen = sizeof(cm.b);
    c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &sfd, sizeof(int));
    /* the gateway's socket is idle (it waits for this answer): the line goes at once */
    w = sendmsg(bufferevent_getfd(h->bc), &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w <= 0 || ((size_t)w < total && bufferevent_write(h->bc, buf + w, total - (size_t)w) < 0)) {
        free(buf);
        hop_free(h); /* the gateway left (or its socket is full: it is not waiting) */
        return;
    }
    free(buf);
    h->phase = HOP_LOCAL;
    h->ing->nlocal++;
    sf_bev_no_timeouts(h->bs);
    bufferevent_disable(h->bs, EV_READ | EV_WRITE);
    bufferevent_setcb(h->bs, NULL, NULL, NULL, NULL);
    sf_bev_no_timeouts(h->bc);
    bufferevent_setwatermark(h->bc, EV_READ, 0, 0);
    bufferevent_setcb(h->bc, on_local_read, NULL, on_local_event, h);
    /* (write interest only for a rest that did not fit: no wake-up per hop for nothing) */
    bufferevent_enable(h->bc, (size_t)w < total ? EV_READ | EV_WRITE : EV_READ);
    on_local_read(h->bc, h); /* (report lines already read: none from a gateway of ours) */
}

static void refuse_not_listening(wk_hop *h)
{
    char why[256];

    snprintf(why, sizeof(why), MSG_NOTHING_LISTENS_FMT, h->id, h->port);
    hop_refuse(h, 502, why);
}

/* The relay's answer: "OK\n" (connected to the port) or anything else (nothing there). */
static void on_relay_line(struct bufferevent *bev, void *arg)
{
    wk_hop *h = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_LF);
    char line[8];

    if (eol.pos < 0) {
        if (evbuffer_get_length(in) >= sizeof(line))
            refuse_not_listening(h);
        return;
    }
    if ((size_t)eol.pos >= sizeof(line)) {
        refuse_not_listening(h);
        return;
    }
    evbuffer_remove(in, line, (size_t)eol.pos + 1);
    line[eol.pos] = '\0';
    if (strcmp(line, "OK") != 0) {
        refuse_not_listening(h);
        return;
    }
    sf_bev_no_timeouts(bev);
    pump_start(h);
}

static void on_relay_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    refuse_not_listening(arg);
}

static void on_relay_line(struct bufferevent *bev, void *arg);
static void on_relay_event(struct bufferevent *bev, short what, void *arg);
static void refuse_not_listening(wk_hop *h);

static void on_sandbox_event(struct bufferevent *bev, short what, void *arg)
{
    wk_hop *h = arg;
    struct timeval tv = {10, 0};

    if (!(what & BEV_EVENT_CONNECTED)) {
        refuse_not_listening(h);
        return;
    }
    if (!h->relay) {
        pump_start(h);
        return;
    }
    /* the relay: the port, then its answer within 10 s */
    evbuffer_add_printf(bufferevent_get_output(bev), "%u\n", h->port);
    bufferevent_set_timeouts(bev, &tv, NULL);
    bufferevent_setcb(bev, on_relay_line, NULL, on_relay_event, h);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

/* While connecting: the client's side may only end. */
static void on_client_wait_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    hop_free(arg);
}

void wk_ingress_admit(wk_hop *h, const wk_hop_target *t)
{
    wk_ingress *ing = h->ing;

    if (h->client_gone) { /* the client left (or heard 504): nothing to answer */
        close(t->fd);
        hop_free(h);
        return;
    }
    event_del(h->ev_open);
    snprintf(h->team, sizeof(h->team), "%s", t->team ? t->team : "");
    h->relay = t->relay;
    h->phase = HOP_CONNECTING;
    if (!(h->bs = bufferevent_socket_new(ing->cfg.base, t->fd, BEV_OPT_CLOSE_ON_FREE))) {
        close(t->fd);
        hop_refuse(h, 503, SF_MSG_HOST_NOMEM);
        return;
    }
    bufferevent_setcb(h->bs, NULL, NULL, on_sandbox_event, h);
    bufferevent_setcb(h->bc, NULL, NULL, on_client_wait_event, h);
    if (bufferevent_socket_connect(h->bs, (const struct sockaddr *)&t->addr, (int)t->addrlen) < 0)
        refuse_not_listening(h);
}

void wk_ingress_refuse(wk_hop *h, int status, const char *why)
{
    if (h->client_gone) { /* the client left (or heard 504): nothing to answer */
        hop_free(h);
        return;
    }
    event_del(h->ev_open);
    hop_refuse(h, status, why);
}

static void on_open_late(evutil_socket_t fd, short what, void *arg)
{
    wk_hop *h = arg;
    char line[256];
    int n;

    (void)fd;
    (void)what;
    /* the client hears now and goes; the hop ends with the daemon's answer, which comes
     * (a resume always ends) */
    n = snprintf(line, sizeof(line), "SFHOP1 ERR 504 Sandbox %s did not resume in time; "
                 "retry in a few seconds.\n", h->id);
    if (h->bc) {
        /* one short line into an idle socket's buffer: written at once or not at all */
        if (send(bufferevent_getfd(h->bc), line, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            (void)0;
        bufferevent_free(h->bc);
        h->bc = NULL;
    }
    h->client_gone = 1;
}

/* ---- the hop line ---- */

/* 0 when the nonce was not seen in the window (and is now remembered); -EEXIST a replay;
 * -ENOSPC the cache is full of live nonces. */
static int nonce_fresh(wk_ingress *ing, const char *nonce, int64_t iat, int64_t now)
{
    struct nonce_ent *e;

    while (ing->ring_len > 0 && ing->ring[ing->ring_head].until_ms < now) {
        sf_map_del(ing->nonces, ing->ring[ing->ring_head].nonce);
        ing->ring_head = (ing->ring_head + 1) % ing->cfg.replay_max;
        ing->ring_len--;
    }
    if (sf_map_get(ing->nonces, nonce))
        return -EEXIST;
    if (ing->ring_len >= ing->cfg.replay_max)
        return -ENOSPC;
    e = &ing->ring[(ing->ring_head + ing->ring_len) % ing->cfg.replay_max];
    snprintf(e->nonce, sizeof(e->nonce), "%s", nonce);
    /* the line is good until iat + the window; it was taken no earlier than now - window */
    e->until_ms = (iat > now ? iat : now) + SF_PV_HOP_WINDOW_MS + 1000;
    if (sf_map_put(ing->nonces, e->nonce, e) < 0)
        return -ENOSPC;
    ing->ring_len++;
    return 0;
}

static int all_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return s[n] == '\0';
}

/* Parses and checks the line; 0 and the sandbox's id, port, epoch; else the status. */
static int check_line(wk_ingress *ing, char *line, char id[SF_ID_MAX], unsigned *port,
                      uint64_t *epoch)
{
    char *f[8], *sp, mac[SF_PV_MAC_HEX + 1];
    int n = 0;
    int64_t p, iat, now = sf_now_ms(), ep;

    /* seven fields, one space between each */
    for (f[n++] = line; n < 8 && (sp = strchr(f[n - 1], ' ')); f[n++] = sp + 1)
        *sp = '\0';
    if (n != 7 || strcmp(f[0], "SFHOP1") != 0 || !sf_id_valid(f[1]) ||
        sf_parse_i64(f[2], 1, 65535, &p) < 0 || sf_parse_i64(f[3], 0, INT64_MAX, &ep) < 0 ||
        sf_parse_i64(f[4], 0, INT64_MAX, &iat) < 0 || strlen(f[5]) != SF_PV_NONCE_HEX ||
        !all_hex(f[5], SF_PV_NONCE_HEX) || strlen(f[6]) != SF_PV_MAC_HEX ||
        !all_hex(f[6], SF_PV_MAC_HEX))
        return 403;
    if (iat < now - SF_PV_HOP_WINDOW_MS || iat > now + SF_PV_HOP_WINDOW_MS)
        return 403;
    sf_pv_hop_mac(ing->key, f[1], (unsigned)p, (uint64_t)ep, iat, f[5], mac);
    if (sf_pv_hex_equal(mac, f[6], SF_PV_MAC_HEX) != 0)
        return 403;
    switch (nonce_fresh(ing, f[5], iat, now)) {
    case 0:
        break;
    case -EEXIST:
        return 403;
    default:
        return 503;
    }
    snprintf(id, SF_ID_MAX, "%s", f[1]);
    *port = (unsigned)p;
    *epoch = (uint64_t)ep;
    return 0;
}

static void on_line(struct bufferevent *bev, void *arg)
{
    wk_hop *h = arg;
    wk_ingress *ing = h->ing;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_LF);
    char line[SF_PV_HOP_LINE_MAX + 1];
    uint64_t epoch = 0;
    unsigned port = 0;
    int st;
    sb_count *c;

    if (eol.pos < 0) {
        if (evbuffer_get_length(in) >= SF_PV_HOP_LINE_MAX)
            hop_refuse(h, 403, "The hop was refused.");
        return;
    }
    if ((size_t)eol.pos >= SF_PV_HOP_LINE_MAX) {
        hop_refuse(h, 403, "The hop was refused.");
        return;
    }
    evbuffer_remove(in, line, (size_t)eol.pos + 1);
    line[eol.pos] = '\0';
    if (strlen(line) != (size_t)eol.pos) { /* a NUL inside */
        hop_refuse(h, 403, "The hop was refused.");
        return;
    }
    if ((st = check_line(ing, line, h->id, &port, &epoch)) != 0) {
        hop_refuse(h, st, st == 503 ? MSG_FULL : "The hop was refused.");
        return;
    }
    h->port = port;
    c = sf_map_get(ing->per_sb, h->id);
    if (c && c->n >= ing->cfg.conns_per_sandbox) {
        char why[200];
        snprintf(why, sizeof(why), "Sandbox %s has %u preview connections open, its limit; "
                 "retry when some closed.", h->id, c->n);
        hop_refuse(h, 503, why);
        return;
    }
    if (!c) {
        if (!(c = calloc(1, sizeof(*c))) || sf_map_put(ing->per_sb, h->id, c) < 0) {
            free(c);
            hop_refuse(h, 503, MSG_FULL);
            return;
        }
    }
    c->n++;
    h->counted = 1;
    h->phase = HOP_OPENING;
    bufferevent_disable(bev, EV_READ); /* what follows waits for the sandbox */
    sf_bev_no_timeouts(bev);
    bufferevent_setcb(bev, NULL, NULL, on_client_wait_event, h);
    {
        struct timeval tv = {ing->cfg.open_timeout_ms / 1000,
                             (ing->cfg.open_timeout_ms % 1000) * 1000};
        event_add(h->ev_open, &tv);
    }
    ing->cfg.open(ing->cfg.arg, h, h->id, port, epoch);
}

/* While the daemon decides, the client may only leave. */
static void on_line_event(struct bufferevent *bev, short what, void *arg)
{
    wk_hop *h = arg;

    (void)bev;
    if (what & BEV_EVENT_TIMEOUT) {
        hop_refuse(h, 403, "The hop was refused.");
        return;
    }
    hop_end(h);
}

/* A connection to either listener: the same line, checks and limits; only the end differs
 * (local: the socket passed, not pumped). */
static void hop_accept(wk_ingress *ing, evutil_socket_t fd, int local)
{
    wk_hop *h;
    struct timeval tv = {ing->cfg.line_timeout_ms / 1000, (ing->cfg.line_timeout_ms % 1000) * 1000};
    int one = 1;

    if (!(h = calloc(1, sizeof(*h)))) {
        close(fd);
        return;
    }
    h->ing = ing;
    h->local = local;
    SF_LIST_PUSH(ing->hops, h);
    ing->nhops++;
    if (!local)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!(h->bc = bufferevent_socket_new(ing->cfg.base, fd, BEV_OPT_CLOSE_ON_FREE)) ||
        !(h->ev_open = evtimer_new(ing->cfg.base, on_open_late, h))) {
        if (!h->bc)
            close(fd);
        hop_free(h);
        return;
    }
    if (ing->nhops > ing->cfg.conns_max) {
        hop_refuse(h, 503, MSG_FULL);
        return;
    }
    bufferevent_setwatermark(h->bc, EV_READ, 0, SF_PV_HOP_LINE_MAX);
    bufferevent_set_timeouts(h->bc, &tv, NULL);
    bufferevent_setcb(h->bc, on_line, NULL, on_line_event, h);
    bufferevent_enable(h->bc, EV_READ);
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    (void)lis;
    (void)sa;
    (void)salen;
    hop_accept(arg, fd, 0);
}

/* The local socket: only a peer running as our user or root (its folder's mode says the
 * same; this holds even if the folder were opened up). */
static void on_accept_local(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                            int salen, void *arg)
{
    struct ucred cr;
    socklen_t cl = sizeof(cr);

    (void)lis;
    (void)sa;
    (void)salen;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 ||
        (cr.uid != 0 && cr.uid != geteuid())) {
        close(fd);
        return;
    }
    hop_accept(arg, fd, 1);
}

/* The local hop's folder (0700, ours) and socket; its path published as given, resolved. */
static int local_listen(wk_ingress *ing, char *why, size_t whylen)
{
    const char *dir = ing->cfg.local_dir;
    char real[PATH_MAX];
    struct sockaddr_un sun;
    struct stat st;
    int fd = -1, e;

    if ((mkdir(dir, 0700) < 0 && errno != EEXIST) ||
        (ing->ldir = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fstat(ing->ldir, &st) < 0) {
        e = errno;
        snprintf(why, whylen, "The preview ingress cannot make its local-hop folder %s: %s; fix "
                 "state_dir or set ingress_local 0.", dir, strerror(e));
        return -e;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077)) {
        snprintf(why, whylen, "The preview ingress's local-hop folder %s must be the worker's "
                 "own with mode 0700; fix it or set ingress_local 0.", dir);
        return -EPERM;
    }
    if (!realpath(dir, real) || strlen(real) + sizeof("/ingress.sock") > sizeof(ing->lpath)) {
        snprintf(why, whylen, "The preview ingress's local-hop folder %s has no short absolute "
                 "path (%zu bytes at most); set ingress_local 0.", dir,
                 sizeof(ing->lpath) - sizeof("/ingress.sock"));
        return -ENAMETOOLONG;
    }
    if (unlinkat(ing->ldir, "ingress.sock", 0) < 0 && errno != ENOENT) {
        e = errno;
        snprintf(why, whylen, "The preview ingress cannot replace %s/ingress.sock: %s; remove "
                 "it or set ingress_local 0.", real, strerror(e));
        return -e;
    }
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    /* through the folder's fd: no link followed, no length limit on the folder's path */
    snprintf(sun.sun_path, sizeof(sun.sun_path), "/proc/self/fd/%d/ingress.sock", ing->ldir);
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0 ||
        bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(fd, 512) < 0 ||
        !(ing->llis = evconnlistener_new(ing->cfg.base, on_accept_local, ing,
                                         LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd))) {
        e = errno ? errno : ENOMEM;
        if (fd >= 0)
            close(fd);
        snprintf(why, whylen, "The preview ingress cannot listen on %s/ingress.sock: %s; set "
                 "ingress_local 0.", real, strerror(e));
        return -e;
    }
    memcpy(ing->lpath, real, strlen(real)); /* (fits: checked above) */
    memcpy(ing->lpath + strlen(real), "/ingress.sock", sizeof("/ingress.sock"));
    return 0;
}

/* ---- the listener ---- */

static int parse_addr(const char *s, struct sockaddr_in *sin)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    int64_t port;

    if (!colon || (size_t)(colon - s) >= sizeof(host) ||
        sf_parse_i64(colon + 1, 0, 65535, &port) < 0)
        return -EINVAL;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sin->sin_addr) == 1 ? 0 : -EINVAL;
}

int wk_ingress_new(const wk_ingress_cfg *cfg, wk_ingress **out, char *why, size_t whylen)
{
    wk_ingress *ing;
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    char ip[INET_ADDRSTRLEN];

    if (parse_addr(cfg->listen, &sin) < 0) {
        snprintf(why, whylen, "ingress_listen '%s' is not an IPv4 address and port (ip:port).",
                 cfg->listen);
        return -EINVAL;
    }
    if (!(ing = calloc(1, sizeof(*ing))))
        return -ENOMEM;
    ing->cfg = *cfg;
    ing->ldir = -1;
    memcpy(ing->key, cfg->host_key, 32);
    ing->cfg.host_key = ing->key;
    if (ing->cfg.replay_max < 16)
        ing->cfg.replay_max = 16;
    if (ing->cfg.buf_max < 4096)
        ing->cfg.buf_max = 4096;
    if (!(ing->per_sb = sf_map_new(cfg->conns_max + 1)) || !(ing->teams = sf_map_new(TEAMS_MAX)) ||
        !(ing->nonces = sf_map_new(ing->cfg.replay_max)) ||
        !(ing->ring = calloc(ing->cfg.replay_max, sizeof(*ing->ring)))) {
        wk_ingress_free(ing);
        return -ENOMEM;
    }
    ing->lis = evconnlistener_new_bind(cfg->base, on_accept, ing,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                           LEV_OPT_CLOSE_ON_EXEC,
                                       512, (struct sockaddr *)&sin, sizeof(sin));
    if (!ing->lis) {
        int e = errno ? errno : EADDRINUSE;
        snprintf(why, whylen, "The preview ingress cannot listen on %s: %s; set ingress_listen "
                 "to a free address.", cfg->listen, strerror(e));
        wk_ingress_free(ing);
        return -e;
    }
    if (cfg->local_dir && cfg->local_dir[0]) {
        int rc = local_listen(ing, why, whylen);
        if (rc < 0) {
            wk_ingress_free(ing);
            return rc;
        }
    }
    getsockname(evconnlistener_get_fd(ing->lis), (struct sockaddr *)&sin, &len);
    inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip));
    snprintf(ing->addr, sizeof(ing->addr), "%s:%u", ip, ntohs(sin.sin_port));
    *out = ing;
    return 0;
}

static void free_val(const char *key, void *val, void *arg)
{
    (void)key;
    (void)arg;
    free(val);
}

void wk_ingress_free(wk_ingress *ing)
{
    if (!ing)
        return;
    if (ing->lis)
        evconnlistener_free(ing->lis);
    if (ing->llis) {
        evconnlistener_free(ing->llis);
        unlinkat(ing->ldir, "ingress.sock", 0);
    }
    if (ing->ldir >= 0)
        close(ing->ldir);
    while (ing->hops)
        hop_free(ing->hops);
    if (ing->per_sb) {
        sf_map_foreach(ing->per_sb, free_val, NULL);
        sf_map_free(ing->per_sb);
    }
    if (ing->teams) {
        sf_map_foreach(ing->teams, free_val, NULL);
        sf_map_free(ing->teams);
    }
    sf_map_free(ing->nonces);
    free(ing->ring);
    free(ing);
}

const char *wk_ingress_addr(const wk_ingress *ing)
{
    return ing->addr;
}

const char *wk_ingress_local_path(const wk_ingress *ing)
{
    return ing ? ing->lpath : "";
}

uint64_t wk_ingress_local_hops(const wk_ingress *ing)
{
    return ing ? ing->nlocal : 0;
}

void wk_ingress_drop(wk_ingress *ing, const char *id, unsigned port)
{
    wk_hop *h = ing ? ing->hops : NULL, *next;

    for (; h; h = next) {
        next = h->next;
        if (strcmp(h->id, id) != 0 || (port && h->port != port))
            continue;
        if (h->phase == HOP_LOCAL) /* the gateway's relay holds the socket too: it ends now */
            shutdown(bufferevent_getfd(h->bs), SHUT_RDWR);
        if (h->phase == HOP_PUMP || h->phase == HOP_CONNECTING || h->phase == HOP_LOCAL)
            hop_free(h);
        /* a hop in its line phase has no id yet; one opening hears the daemon's answer */
    }
}

uint32_t wk_ingress_open_hops(const wk_ingress *ing)
{
    return ing ? ing->nhops : 0;
}

typedef struct sb_walk {
    void (*fn)(void *arg, const char *id);
    void *arg;
} sb_walk;

static void walk_sb(const char *key, void *val, void *arg)
{
    sb_walk *w = arg;

    (void)val;
    w->fn(w->arg, key);
}

void wk_ingress_sandboxes(const wk_ingress *ing, void (*fn)(void *arg, const char *id),
                          void *arg)
{
    sb_walk w = {fn, arg};

    if (ing)
        sf_map_foreach(ing->per_sb, walk_sb, &w);
}

typedef struct teams_walk {
    void (*fn)(void *arg, const char *team, uint64_t in, uint64_t out);
    void *arg;
} teams_walk;

static void walk_team(const char *key, void *val, void *arg)
{
    teams_walk *w = arg;
    team_bytes *t = val;

    w->fn(w->arg, key, t->in, t->out);
}

void wk_ingress_teams(const wk_ingress *ing,
                      void (*fn)(void *arg, const char *team, uint64_t in, uint64_t out),
                      void *arg)
{
    teams_walk w = {fn, arg};

    for (wk_hop *h = ing->hops; h; h = h->next)
        hop_flush_bytes(h);
    sf_map_foreach(ing->teams, walk_team, &w);
}

/* ---- a socket inside a network namespace ---- */

typedef struct ns_sock {
    uint32_t mark;
    int netns;
    int fd;
    int err;
} ns_sock;

static void *ns_sock_main(void *arg)
{
    ns_sock *s = arg;

    /* this thread alone enters the namespace, and ends right after */
    if (setns(s->netns, CLONE_NEWNET) < 0) {
        s->err = errno;
        return NULL;
    }
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->fd < 0)
        s->err = errno;
    else if (s->mark && setsockopt(s->fd, SOL_SOCKET, SO_MARK, &s->mark, sizeof(s->mark)) < 0) {
        s->err = errno;
        close(s->fd);
        s->fd = -1;
    }
    return NULL;
}

int wk_ingress_netns_socket(int netns, uint32_t mark, int *fd)
{
    ns_sock s = {.mark = mark, .netns = netns, .fd = -1, .err = 0};
    pthread_t t;
    int one = 1;
    int rc;

    if (netns < 0)
        return -EBADF;
    if ((rc = pthread_create(&t, NULL, ns_sock_main, &s)) != 0)
        return -rc;
    pthread_join(t, NULL);
    if (s.fd < 0)
        return -(s.err ? s.err : EIO);
    setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd = s.fd;
    return 0;
}
