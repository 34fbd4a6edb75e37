/* kb_conn: the broker's client connections: reading size-framed requests off a bufferevent,
 * one at a time and in order (a request that waits for its answer holds the later ones),
 * queuing answers, and pausing a connection whose client does not read its answers. */
#include "broker.h"
#include "sf_list.h"
#include "sf_log.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void kb_conn_free(kb_conn *c)
{
    kb_server *s;

    if (!c)
        return;
    s = c->s;
    kb_fetch_free(c->fetch);
    kb_groups_conn_gone(s->groups, c);
    SF_LIST_UNLINK(s->conns, c);
    s->nconns--;
    if (c->resume)
        event_free(c->resume);
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

void kb_conn_send(kb_conn *c, int32_t corr, const kb_wbuf *body)
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

void kb_conn_answered(kb_conn *c)
{
    c->parked = 0;
    event_active(c->resume, EV_READ, 0);
}

void kb_conn_group_reply(void *ctx, const kb_req *req, kb_wbuf *body)
{
    kb_conn *c = req->conn;

    if (body->err) { /* not within the bounds the group module checks */
        sf_warn("msg=\"a group answer did not fit; the client's connection is closed\"");
        c->dead = 1;
    } else {
        kb_conn_send(c, req->corr, body);
    }
    kb_conn_answered(c);
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
            kb_conn_free(c);
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
            kb_conn_free(c);
            return;
        }
        if (have < 4 + (size_t)size)
            break;
        if (!(p = evbuffer_pullup(in, 4 + (ssize_t)size))) {
            kb_conn_free(c);
            return;
        }
        s->st.bytes_in += size + 4;
        if ((rc = kb_server_request(c, p + 4, (size_t)size)) < 0) {
            s->st.malformed++;
            sf_info("msg=\"malformed request; connection closed\" api=%d err=\"%s\"",
                    (int)(int16_t)((p[4] << 8) | p[5]), strerror(-rc));
            kb_conn_free(c);
            return;
        }
        evbuffer_drain(in, 4 + (size_t)size);
        if (c->dead) {
            kb_conn_free(c);
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
        kb_conn_free(arg);
}

kb_conn *kb_conn_new(kb_server *s, evutil_socket_t fd)
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
    SF_LIST_PUSH(s->conns, c);
    s->nconns++;
    s->st.conns++;
    bufferevent_setcb(c->bev, conn_on_read, conn_on_write, conn_on_event, c);
    /* a client that sends while its request waits is not read past one whole request */
    bufferevent_setwatermark(c->bev, EV_READ, 0, s->cfg.max_request + 4);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return c;
}
