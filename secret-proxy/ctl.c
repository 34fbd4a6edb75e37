/* The control socket (schemas/secret-proxy-control.md): a Unix SOCK_SEQPACKET socket,
 * one JSON object per message each way, the sandbox's netns fd passed with SCM_RIGHTS.
 * Only root (the worker) can reach it (mode 0600). */
#include "proxy.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CTL_MSG_MAX (64 * 1024)
#define CTL_CLIENTS_MAX 64

typedef struct ctl_client {
    struct ctl_client *next, *prev; /* open connections, closed at stop */
    sp_ctx *ctx;
    int fd;
    struct event *ev;
    int refs;
    int dead;
} ctl_client;

typedef struct ctl_req {
    ctl_client *c;
    json_t *id;
} ctl_req;

static int clients_n;
static ctl_client *clients;

static void client_unref(ctl_client *c)
{
    if (--c->refs > 0)
        return;
    clients_n--;
    free(c);
}

static void client_close(ctl_client *c)
{
    if (c->dead)
        return;
    c->dead = 1;
    if (c->prev)
        c->prev->next = c->next;
    else
        clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    event_free(c->ev);
    close(c->fd);
    client_unref(c);
}

static void send_reply(ctl_client *c, json_t *id, json_t *reply)
{
    char *txt;

    if (c->dead)
        return;
    json_object_set(reply, "id", id ? id : json_null());
    if (!(txt = json_dumps(reply, JSON_COMPACT)))
        return;
    if (send(c->fd, txt, strlen(txt), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        sf_warn("msg=\"control reply not sent\" err=\"%s\"", strerror(errno));
    free(txt);
}

static void on_done(void *arg, json_t *reply)
{
    ctl_req *r = arg;

    send_reply(r->c, r->id, reply);
    client_unref(r->c);
    json_decref(r->id);
    free(r);
}

static void reply_error(ctl_client *c, json_t *id, const char *msg)
{
    json_t *r = json_pack("{s:b, s:s}", "ok", 0, "error", msg);

    send_reply(c, id, r);
    json_decref(r);
}

static void status(sp_ctx *ctx, ctl_client *c, json_t *id)
{
    const sp_cfg *k = &ctx->cfg;
    json_t *r = json_pack("{s:b, s:I, s:I, s:b, s:s, s:s, s:s, s:I, s:I, s:I}", "ok", 1,
                          "sandboxes", (json_int_t)sf_map_len(ctx->sandboxes),
                          "netlog_dropped", (json_int_t)ctx->netlog_dropped, "redis",
                          sf_redis_connected(ctx->redis), "instance", ctx->instance, "ca_file",
                          k->proxy_ca_cert_file, "egress_default", k->egress_default,
                          "http_port", (json_int_t)k->proxy_http_port, "transparent_port",
                          (json_int_t)k->proxy_transparent_port, "dns_port",
                          (json_int_t)k->proxy_dns_port);
    send_reply(c, id, r);
    json_decref(r);
}

static void handle(ctl_client *c, const char *msg, size_t n, int fd)
{
    json_error_t jerr;
    json_t *req = json_loadb(msg, n, JSON_REJECT_DUPLICATES, &jerr), *id;
    const char *op;
    ctl_req *r;

    if (!req || !json_is_object(req)) {
        reply_error(c, NULL, "The control message must be one JSON object.");
        goto out;
    }
    id = json_object_get(req, "id");
    op = json_string_value(json_object_get(req, "op"));
    if (!op || (strcmp(op, "register") && strcmp(op, "update") && strcmp(op, "unregister") &&
                strcmp(op, "status"))) {
        reply_error(c, id, "'op' must be register, update, unregister or status.");
        goto out;
    }
    if (!strcmp(op, "status")) {
        status(c->ctx, c, id);
        goto out;
    }
    if (!(r = calloc(1, sizeof(*r)))) {
        reply_error(c, id, SF_MSG_PROXY_NOMEM);
        goto out;
    }
    r->c = c;
    c->refs++;
    r->id = json_incref(id);
    if (!strcmp(op, "register")) {
        sp_sandbox_register(c->ctx, req, fd, on_done, r);
        fd = -1; /* owned by register now */
    } else if (!strcmp(op, "update")) {
        sp_sandbox_update(c->ctx, req, on_done, r);
    } else {
        sp_sandbox_unregister(c->ctx, req, on_done, r);
    }
out:
    if (fd >= 0)
        close(fd);
    json_decref(req);
}

static void on_client(evutil_socket_t fd, short what, void *arg)
{
    ctl_client *c = arg;
    char *buf = malloc(CTL_MSG_MAX);
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct iovec iov = {buf, CTL_MSG_MAX};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
                        .msg_controllen = sizeof(cm.b)};
    ssize_t n;
    int passed = -1;

    if (!buf)
        return;
    n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        free(buf);
        return;
    }
    for (struct cmsghdr *h = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; h; h = CMSG_NXTHDR(&mh, h))
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
            h->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&passed, CMSG_DATA(h), sizeof(int));
    if (n <= 0) {
        if (passed >= 0)
            close(passed);
        free(buf);
        client_close(c);
        return;
    }
    if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        if (passed >= 0)
            close(passed);
        reply_error(c, NULL, "The control message is too large (64 KiB at most, one fd).");
    } else {
        handle(c, buf, (size_t)n, passed);
    }
    free(buf);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *a,
                      int alen, void *arg)
{
    sp_ctx *ctx = arg;
    ctl_client *c;

    if (clients_n >= CTL_CLIENTS_MAX || !(c = calloc(1, sizeof(*c)))) {
        sf_warn("msg=\"control connection refused\" clients=%d", clients_n);
        close(fd);
        return;
    }
    clients_n++;
    c->ctx = ctx;
    c->fd = fd;
    c->refs = 1;
    if (!(c->ev = event_new(ctx->d.base, fd, EV_READ | EV_PERSIST, on_client, c)) ||
        event_add(c->ev, NULL) < 0) {
        if (c->ev)
            event_free(c->ev);
        close(fd);
        clients_n--;
        free(c);
        return;
    }
    c->next = clients;
    if (clients)
        clients->prev = c;
    clients = c;
}

int sp_ctl_start(sp_ctx *ctx, char *why, size_t whylen)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    const char *path = ctx->cfg.proxy_control_socket;
    int fd;

    if (strlen(path) >= sizeof(a.sun_path)) {
        snprintf(why, whylen, "control_socket path %s is too long (107 bytes at most).", path);
        return -ENAMETOOLONG;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return -errno;
    unlink(path);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || chmod(path, 0600) < 0 ||
        listen(fd, 64) < 0) {
        int e = -errno;
        snprintf(why, whylen, "Cannot listen on the control socket %s: %s.", path, strerror(-e));
        close(fd);
        return e;
    }
    if (!(ctx->ctl = evconnlistener_new(ctx->d.base, on_accept, ctx, LEV_OPT_CLOSE_ON_FREE, -1,
                                        fd))) {
        close(fd);
        return -ENOMEM;
    }
    return 0;
}

void sp_ctl_stop(sp_ctx *ctx)
{
    while (clients)
        client_close(clients); /* requests still waiting keep their client until answered */
    if (ctx->ctl) {
        evconnlistener_free(ctx->ctl);
        ctx->ctl = NULL;
        unlink(ctx->cfg.proxy_control_socket);
    }
}
