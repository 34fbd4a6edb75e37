/* A small asynchronous QMP client on libevent (the QEMU Machine Protocol:
 * JSON objects, one per line, over the monitor socket).
 *
 * On connect QEMU sends a greeting; the client answers qmp_capabilities
 * itself (queued first, so commands may be queued at once). Every command
 * carries an "id" and its callback runs when the answer with that id arrives;
 * lines with "event" go to the event callback. A command can pass one file
 * descriptor (SCM_RIGHTS, for `getfd`), so output is written with sendmsg
 * from our own queue rather than through a bufferevent.
 *
 * What QEMU sends is bounded: a line longer than WK_QMP_LINE_MAX, or one that
 * is not a JSON object, closes the connection (every pending command then
 * gets an error). */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qemu_int.h"

#define ERR_CLOSED "QEMU closed its monitor connection (the VM process ended)."
#define ERR_BAD "QEMU sent an invalid monitor message."

typedef struct qmp_cmd {
    struct qmp_cmd *next;
    uint64_t id;
    wk_qmp_cb cb;
    void *arg;
    char *text;   /* the line to send (owned) */
    size_t len, off;
    int fd;       /* to pass with the first byte, or -1 (owned until sent) */
} qmp_cmd;

struct wk_qmp {
    int fd;
    struct event *ev_read, *ev_write;
    struct evbuffer *in;
    qmp_cmd *out_head, *out_tail;  /* not fully sent yet */
    qmp_cmd *wait_head, *wait_tail; /* sent, waiting for their answer */
    uint64_t next_id;
    wk_qmp_event_cb on_event;
    void *ev_arg;
    int closed;
    int depth;    /* > 0 while callbacks run */
    int freed;    /* wk_qmp_free ran during a callback */
};

static void cmd_free(qmp_cmd *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->text);
    free(c);
}

/* Frees q once wk_qmp_free ran and no callback of it is on the stack. */
static void release(wk_qmp *q)
{
    if (!q->freed || q->depth > 0)
        return;
    if (q->ev_read)
        event_free(q->ev_read);
    if (q->ev_write)
        event_free(q->ev_write);
    if (q->in)
        evbuffer_free(q->in);
    free(q);
}

/* Fails every command (sent or not) with err; callbacks may free q. */
static void fail_all(wk_qmp *q, const char *err)
{
    while (q->wait_head || q->out_head) {
        qmp_cmd *c;
        if (q->wait_head) {
            c = q->wait_head;
            q->wait_head = c->next;
        } else {
            c = q->out_head;
            q->out_head = c->next;
        }
        if (c->cb && !q->freed)
            c->cb(c->arg, NULL, err);
        cmd_free(c);
    }
    q->wait_tail = q->out_tail = NULL;
}

static void close_conn(wk_qmp *q, const char *err)
{
    if (q->closed)
        return;
    q->closed = 1;
    event_del(q->ev_read);
    event_del(q->ev_write);
    q->depth++;
    fail_all(q, err);
    if (q->on_event && !q->freed)
        q->on_event(q->ev_arg, NULL, NULL);
    q->depth--;
}

static void handle_line(wk_qmp *q, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr), *v;
    qmp_cmd *c, *prev = NULL;
    uint64_t id;

    if (!json_is_object(msg)) {
        json_decref(msg);
        close_conn(q, ERR_BAD);
        return;
    }
    if (json_object_get(msg, "QMP")) { /* the greeting: qmp_capabilities is queued already */
        json_decref(msg);
        return;
    }
    if ((v = json_object_get(msg, "event"))) {
        if (json_is_string(v) && q->on_event)
            q->on_event(q->ev_arg, json_string_value(v), json_object_get(msg, "data"));
        json_decref(msg);
        return;
    }
    v = json_object_get(msg, "id");
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        json_decref(msg);
        return; /* an answer to nobody (QEMU's own error for an unparsable line) */
    }
    id = (uint64_t)json_integer_value(v);
    for (c = q->wait_head; c && c->id != id; c = c->next)
        prev = c;
    if (!c) {
        json_decref(msg);
        return;
    }
    if (prev)
        prev->next = c->next;
    else
        q->wait_head = c->next;
    if (q->wait_tail == c)
        q->wait_tail = prev;
    if (c->cb) {
        json_t *err = json_object_get(msg, "error");
        if (err) {
            const char *desc = json_string_value(json_object_get(err, "desc"));
            c->cb(c->arg, NULL, desc && desc[0] ? desc : "QEMU refused the command.");
        } else {
            json_t *ret = json_object_get(msg, "return");
            c->cb(c->arg, ret ? ret : json_null(), NULL);
        }
    }
    cmd_free(c);
    json_decref(msg);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    wk_qmp *q = arg;
    int n;

    (void)what;
    q->depth++;
    n = evbuffer_read(q->in, fd, 65536);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close_conn(q, ERR_CLOSED);
        goto out;
    }
    while (!q->closed && !q->freed) {
        struct evbuffer_ptr eol = evbuffer_search_eol(q->in, NULL, NULL, EVBUFFER_EOL_LF);
        size_t len;
        char *line;

        if (eol.pos < 0) {
            if (evbuffer_get_length(q->in) > WK_QMP_LINE_MAX)
                close_conn(q, ERR_BAD);
            break;
        }
        len = (size_t)eol.pos;
        if (len > WK_QMP_LINE_MAX) {
            close_conn(q, ERR_BAD);
            break;
        }
        line = (char *)evbuffer_pullup(q->in, (ev_ssize_t)len + 1);
        if (!line) {
            close_conn(q, "Out of memory reading QEMU's monitor.");
            break;
        }
        handle_line(q, line, len);
        evbuffer_drain(q->in, len + 1);
    }
out:
    q->depth--;
    release(q);
}

/* Sends what is queued; 0, or -1 when the connection broke. */
static int flush_out(wk_qmp *q)
{
    while (q->out_head) {
        qmp_cmd *c = q->out_head;
        struct iovec iov = {c->text + c->off, c->len - c->off};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        ssize_t n;

        if (c->fd >= 0) {
            struct cmsghdr *cm;
            memset(&u, 0, sizeof(u));
            mh.msg_control = u.buf;
            mh.msg_controllen = sizeof(u.buf);
            cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &c->fd, sizeof(int));
        }
        n = sendmsg(q->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            return -1;
        }
        if (c->fd >= 0) { /* passed with the first bytes */
            close(c->fd);
            c->fd = -1;
        }
        c->off += (size_t)n;
        if (c->off < c->len)
            continue;
        q->out_head = c->next;
        if (!q->out_head)
            q->out_tail = NULL;
        c->next = NULL;
        if (q->wait_tail)
            q->wait_tail->next = c;
        else
            q->wait_head = c;
        q->wait_tail = c;
    }
    return 0;
}

static void update_write(wk_qmp *q)
{
    if (q->out_head && !q->closed)
        event_add(q->ev_write, NULL);
    else
        event_del(q->ev_write);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    wk_qmp *q = arg;

    (void)fd;
    (void)what;
    q->depth++;
    if (flush_out(q) < 0)
        close_conn(q, ERR_CLOSED);
    else
        update_write(q);
    q->depth--;
    release(q);
}

int wk_qmp_cmd(wk_qmp *q, const char *cmd, json_t *args, int pass_fd, wk_qmp_cb cb, void *arg)
{
    json_t *msg;
    qmp_cmd *c;
    char *text;

    if (!q || !cmd) {
        json_decref(args);
        return -EINVAL;
    }
    if (q->closed) {
        json_decref(args);
        return -EPIPE;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
        json_decref(args);
        return -ENOMEM;
    }
    c->id = ++q->next_id;
    c->cb = cb;
    c->arg = arg;
    c->fd = -1;
    msg = json_pack("{s:s, s:I}", "execute", cmd, "id", (json_int_t)c->id);
    if (msg && args)
        json_object_set_new(msg, "arguments", args);
    else
        json_decref(args);
    text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (!text || asprintf(&c->text, "%s\n", text) < 0) {
        free(text);
        free(c);
        return -ENOMEM;
    }
    free(text);
    c->len = strlen(c->text);
    if (pass_fd >= 0 && (c->fd = fcntl(pass_fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        int rc = -errno;
        cmd_free(c);
        return rc;
    }
    if (q->out_tail)
        q->out_tail->next = c;
    else
        q->out_head = c;
    q->out_tail = c;
    update_write(q);
    return 0;
}

wk_qmp *wk_qmp_new(struct event_base *base, int fd, wk_qmp_event_cb on_event, void *arg)
{
    wk_qmp *q = calloc(1, sizeof(*q));

    if (!q)
        goto fail;
    q->fd = fd;
    q->on_event = on_event;
    q->ev_arg = arg;
    if (evutil_make_socket_nonblocking(fd) < 0 || !(q->in = evbuffer_new()) ||
        !(q->ev_read = event_new(base, fd, EV_READ | EV_PERSIST, on_read, q)) ||
        !(q->ev_write = event_new(base, fd, EV_WRITE | EV_PERSIST, on_write, q)) ||
        event_add(q->ev_read, NULL) < 0 ||
        wk_qmp_cmd(q, "qmp_capabilities", NULL, -1, NULL, NULL) < 0)
        goto fail;
    return q;
fail:
    if (q) {
        q->fd = -1; /* the caller still owns fd */
        wk_qmp_free(q);
    }
    return NULL;
}

void wk_qmp_free(wk_qmp *q)
{
    if (!q || q->freed)
        return;
    q->freed = 1;
    while (q->wait_head || q->out_head) { /* nobody is told: the owner is going away */
        qmp_cmd *c = q->wait_head ? q->wait_head : q->out_head;
        if (c == q->wait_head)
            q->wait_head = c->next;
        else
            q->out_head = c->next;
        cmd_free(c);
    }
    q->out_tail = q->wait_tail = NULL;
    if (q->ev_read)
        event_del(q->ev_read);
    if (q->ev_write)
        event_del(q->ev_write);
    if (q->fd >= 0)
        close(q->fd);
    q->fd = -1;
    release(q);
}

json_t *wk_qmp_caps(void)
{
    return json_pack("{s:[{s:s, s:b}, {s:s, s:b}]}", "capabilities", "capability",
                     "x-ignore-shared", "state", 1, "capability", "events", "state", 1);
}
