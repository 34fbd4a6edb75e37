/* The worker's end of an agent connection: see agent_link.h. */
#include "agent_link.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_agentproto.h"
#include "sf_log.h"
#include "sf_util.h"

#define TIMEOUT_DEFAULT 60000u
#define CAP_DEFAULT 32768u

#define ERR_GONE                                                                                  \
    "The sandbox's agent stopped answering (its connection closed); kill this sandbox and "      \
    "create a new one."
#define ERR_BAD "The sandbox's agent sent an invalid message; kill this sandbox and create a new one."
#define ERR_NO_ANSWER                                                                             \
    "The sandbox did not answer within the command's timeout; it may be overloaded: retry, or "   \
    "kill and recreate it."
#define ERR_STDIN                                                                                 \
    "The host ran out of memory while sending the command's stdin; retry, or pass the input "    \
    "through a file (sandbox_files_write)."
#define ERR_PING_LATE "The sandbox's agent did not answer its ping in time."
#define ERR_PING_VERSION                                                                          \
    "The sandbox's agent speaks another protocol version; rebuild sandfleet-agent with the "      \
    "worker."

enum { R_EXEC, R_PING, R_FILE, R_CANCEL };

typedef struct req {
    struct req *next, *prev;
    wk_alink *l;
    uint32_t id;
    int kind;              /* R_* */
    wk_exec_cb exec_cb;
    void (*output_cb)(void *arg, int stream, const char *data, size_t len);
    wk_alink_ping_cb ping_cb;
    wk_file_cb file_cb;
    void *arg;
    struct event *timer;
    uint64_t deadline_ms;  /* monotonic; when held: the time that was left */
    const char *error;     /* set: the request can only fail (link down when queued) */
    uint64_t oom0;         /* exec: the OOM kills counted when it started (oom probe) */
    int bg;                /* exec in the background: answered by `ok` (size = its pid) */
} req;

struct wk_alink {
    struct event_base *base;
    struct bufferevent *bev;
    char name[64];
    const char *down;      /* non-NULL once the link is down: the error for requests */
    req *reqs;
    int n_reqs, n_execs;
    uint32_t next_id;
    int held;
    wk_alink_down_cb on_down;
    void *down_arg;
    uint64_t (*oom)(void *arg); /* the sandbox's OOM kills so far (jail: its cgroup) */
    void *oom_arg;
    int depth;             /* > 0 while callbacks of this link run */
    int freed;
};

static void release(wk_alink *l)
{
    if (l->freed && l->depth == 0)
        free(l);
}

static void req_unlink(wk_alink *l, req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        l->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    l->n_reqs--;
    l->n_execs -= r->kind == R_EXEC;
}

static void req_link(wk_alink *l, req *r)
{
    r->prev = NULL;
    r->next = l->reqs;
    if (l->reqs)
        l->reqs->prev = r;
    l->reqs = r;
    l->n_reqs++;
    l->n_execs += r->kind == R_EXEC;
}

static void req_free(req *r)
{
    if (r->timer)
        event_free(r->timer);
    free(r);
}

/* Runs the request's callback once (unless the link was freed) and frees it. */
static void req_complete(wk_alink *l, req *r, const wk_exec_result *res,
                         const wk_file_result *fres, int rc, const char *why)
{
    req_unlink(l, r);
    l->depth++;
    if (!l->freed) {
        switch (r->kind) {
        case R_PING:
            r->ping_cb(r->arg, rc, why);
            break;
        case R_EXEC:
            r->exec_cb(r->arg, res);
            break;
        case R_FILE:
            r->file_cb(r->arg, fres);
            break;
        case R_CANCEL:
            break;
        }
    }
    l->depth--;
    req_free(r);
}

static void req_fail(wk_alink *l, req *r, const char *error)
{
    wk_exec_result res = {.exit_code = -1, .error = r->error ? r->error : error};
    wk_file_result fres = {.error = res.error};
    req_complete(l, r, &res, &fres, -EPIPE, res.error);
}

static void fail_all(wk_alink *l, const char *error)
{
    while (l->reqs && !l->freed)
        req_fail(l, l->reqs, error);
}

static void detach(wk_alink *l)
{
    if (l->bev) {
        bufferevent_free(l->bev);
        l->bev = NULL;
    }
}

static void go_down(wk_alink *l, const char *error, const char *detail)
{
    if (l->down)
        return;
    l->down = error;
    sf_warn("msg=\"agent link down\" sandbox=%s why=\"%s\"", l->name, detail);
    detach(l);
    l->depth++;
    fail_all(l, error);
    if (l->on_down && !l->freed)
        l->on_down(l->down_arg, error);
    l->depth--;
}

static req *req_find(wk_alink *l, uint32_t id)
{
    for (req *r = l->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* The kind of request each answer belongs to (-1: not an answer). */
static int answers(sf_ap_op op)
{
    switch (op) {
    case SF_AP_PONG:
        return R_PING;
    case SF_AP_RESULT:
    case SF_AP_OUTPUT:
        return R_EXEC;
    case SF_AP_DATA:
    case SF_AP_ENTRIES:
    case SF_AP_PROCS:
    case SF_AP_LOG:
        return R_FILE;
    case SF_AP_OK:
    case SF_AP_ERROR:
        return -2; /* a file request, a cancel (ok) or any request (error) */
    default:
        return -1;
    }
}

static void handle_file(wk_alink *l, req *r, const sf_ap_msg *m)
{
    wk_file_result fres = {0};

    switch (m->op) {
    case SF_AP_ERROR:
        fres.error = m->msg;
        fres.err = (int)m->errnum;
        break;
    case SF_AP_DATA:
        fres.data = m->data;
        fres.data_len = m->data_len;
        fres.size = m->size;
        fres.mtime = m->mtime;
        break;
    case SF_AP_ENTRIES:
        fres.entries = m->entries;
        fres.n_entries = m->n_entries;
        fres.more = m->more;
        break;
    case SF_AP_PROCS:
        fres.procs = m->procs;
        fres.n_procs = m->n_procs;
        fres.more = m->more;
        break;
    case SF_AP_LOG:
        fres.data = m->data;
        fres.data_len = m->data_len;
        fres.size = m->size;
        fres.off = m->off;
        fres.exited = m->exited;
        fres.exit_code = m->exit_code;
        fres.timed_out = m->timed_out;
        break;
    default: /* ok */
        fres.size = m->size;
        break;
    }
    req_complete(l, r, NULL, &fres, 0, NULL);
}

static void handle_msg(wk_alink *l, const sf_ap_msg *m)
{
    wk_exec_result res = {0};
    int kind = answers(m->op);
    req *r;

    if (kind == -1) {
        go_down(l, ERR_BAD, "the agent sent a request-type frame");
        return;
    }
    if (!(r = req_find(l, m->id)) || r->error || (kind >= 0 && r->kind != kind) ||
        (m->op == SF_AP_OK && r->kind != R_FILE && r->kind != R_CANCEL && !r->bg) ||
        (m->op == SF_AP_RESULT && r->bg) ||
        (r->kind == R_PING && m->op != SF_AP_PONG)) {
        /* late (its deadline passed) or never asked */
        sf_debug("msg=\"agent reply without a request\" sandbox=%s id=%u op=%s", l->name, m->id,
                 sf_ap_op_name(m->op));
        return;
    }
    if (m->op == SF_AP_OUTPUT) { /* a chunk of a streamed exec: the request goes on */
        if (r->output_cb) {
            l->depth++;
            r->output_cb(r->arg, (int)m->s, m->data, m->data_len);
            l->depth--;
        }
        return;
    }
    if (m->op == SF_AP_PONG) {
        if (m->version != SF_AP_VERSION)
            req_complete(l, r, NULL, NULL, -EPROTO, ERR_PING_VERSION);
        else
            req_complete(l, r, NULL, NULL, 0, NULL);
        return;
    }
    if (r->kind == R_FILE || r->kind == R_CANCEL) {
        handle_file(l, r, m);
        return;
    }
    if (m->op == SF_AP_ERROR) {
        res.exit_code = -1;
        res.error = m->msg;
    } else if (m->op == SF_AP_OK) { /* a background exec started */
        if (m->size == 0 || m->size > UINT32_MAX) {
            go_down(l, ERR_BAD, "the agent answered a background exec without a pid");
            return;
        }
        res.pid = (uint32_t)m->size;
    } else {
        res.exit_code = m->exit_code;
        res.timed_out = m->timed_out;
        res.out = m->out;
        res.out_len = m->out_len;
        res.out_total = m->out_total;
        res.err = m->err;
        res.err_len = m->err_len;
        res.err_total = m->err_total;
        res.truncated = m->truncated;
        res.duration_ms = m->duration_ms;
        /* the guest's OOM killer (the VM's agent says), or the sandbox's cgroup */
        res.oom_killed = l->oom ? l->oom(l->oom_arg) > r->oom0 : m->oom_killed;
        if (m->pid) { /* detached: it runs on in the background */
            res.pid = m->pid;
            res.still_running = 1;
            res.exit_code = 0;
            res.timed_out = 0;
            res.oom_killed = 0;
        }
    }
    req_complete(l, r, &res, NULL, 0, NULL);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    wk_alink *l = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    l->depth++;
    while (l->bev == bev && !l->freed) {
        unsigned char hdr[SF_AP_HDR_LEN];
        const char *why = NULL;
        size_t flen;
        sf_ap_msg m;
        unsigned char *p;

        if (evbuffer_copyout(in, hdr, sizeof(hdr)) < (ev_ssize_t)sizeof(hdr))
            break;
        if (sf_ap_frame_check(hdr, sizeof(hdr), &flen, &why) < 0) {
            go_down(l, ERR_BAD, why);
            break;
        }
        flen = SF_AP_HDR_LEN + ((size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 |
                                (size_t)hdr[2] << 8 | hdr[3]);
        if (evbuffer_get_length(in) < flen)
            break;
        if (!(p = evbuffer_pullup(in, (ev_ssize_t)flen))) {
            go_down(l, ERR_BAD, "out of memory");
            break;
        }
        if (sf_ap_decode(p + SF_AP_HDR_LEN, flen - SF_AP_HDR_LEN, &m, &why) < 0) {
            go_down(l, ERR_BAD, why);
            break;
        }
        evbuffer_drain(in, flen);
        handle_msg(l, &m);
        sf_ap_msg_fini(&m);
    }
    l->depth--;
    release(l);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    wk_alink *l = arg;

    (void)bev;
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    l->depth++;
    go_down(l, ERR_GONE, what & BEV_EVENT_EOF ? "EOF on the agent connection"
                                              : "error on the agent connection");
    l->depth--;
    release(l);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    req *r = arg;
    wk_alink *l = r->l;
    uint32_t id = r->id;
    int stalled = !r->error && !l->down;

    (void)fd;
    (void)what;
    l->depth++;
    if (stalled) {
        sf_warn("msg=\"agent request passed its deadline unanswered\" sandbox=%s id=%u", l->name,
                id);
        /* The owner first: it may end the link (answering this request with its own
         * words, e.g. that it stopped the VM). */
        if (l->on_down && !l->freed)
            l->on_down(l->down_arg, r->kind == R_PING ? ERR_PING_LATE : ERR_NO_ANSWER);
    }
    if (!l->freed && (r = req_find(l, id))) {
        if (r->kind == R_PING)
            req_complete(l, r, NULL, NULL, -ETIMEDOUT, r->error ? r->error : ERR_PING_LATE);
        else
            req_fail(l, r, ERR_NO_ANSWER);
    }
    l->depth--;
    release(l);
}

static void arm(req *r, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(r->timer, &tv);
}

static int attach(wk_alink *l, int fd)
{
    if (evutil_make_socket_nonblocking(fd) < 0 ||
        !(l->bev = bufferevent_socket_new(l->base, fd, BEV_OPT_CLOSE_ON_FREE))) {
        close(fd);
        return -ENOMEM;
    }
    bufferevent_setcb(l->bev, on_read, NULL, on_event, l);
    if (bufferevent_enable(l->bev, EV_READ | EV_WRITE) < 0) {
        detach(l);
        return -EIO;
    }
    return 0;
}

wk_alink *wk_alink_new(struct event_base *base, int fd, const char *name)
{
    wk_alink *l = calloc(1, sizeof(*l));

    if (!l) {
        close(fd);
        return NULL;
    }
    l->base = base;
    snprintf(l->name, sizeof(l->name), "%s", name ? name : "?");
    if (attach(l, fd) < 0) {
        free(l);
        return NULL;
    }
    return l;
}

void wk_alink_on_down(wk_alink *l, wk_alink_down_cb cb, void *arg)
{
    l->on_down = cb;
    l->down_arg = arg;
}

void wk_alink_oom_probe(wk_alink *l, uint64_t (*fn)(void *arg), void *arg)
{
    l->oom = fn;
    l->oom_arg = arg;
}

/* Queues r with m (encoded now) and its deadline. */
static int submit(wk_alink *l, req *r, sf_ap_msg *m, uint64_t deadline_ms)
{
    const char *why = NULL;
    sf_buf b;
    int rc;

    if (l->n_reqs >= WK_ALINK_REQS_MAX ||
        (r->kind == R_EXEC && l->n_execs >= WK_ALINK_EXECS_MAX))
        return -EBUSY;
    if (++l->next_id == 0)
        l->next_id = 1;
    r->l = l;
    r->id = l->next_id;
    if (!(r->timer = evtimer_new(l->base, on_deadline, r)))
        return -ENOMEM;
    if (l->down) { /* answered from the loop, not from inside this call */
        r->error = l->down;
        arm(r, 0);
        req_link(l, r);
        return 0;
    }
    m->id = r->id;
    sf_buf_init(&b, SF_AP_HDR_LEN + SF_AP_FRAME_MAX);
    rc = sf_ap_encode(&b, m, &why);
    if (rc == 0 && bufferevent_write(l->bev, b.p, b.len) < 0)
        rc = -ENOMEM;
    sf_buf_fini(&b);
    if (rc < 0) {
        event_free(r->timer);
        r->timer = NULL;
        return rc == -EMSGSIZE ? -E2BIG : rc;
    }
    if (l->held) {
        r->deadline_ms = deadline_ms; /* the time left, counted from the release */
    } else {
        arm(r, deadline_ms);
        r->deadline_ms = (uint64_t)sf_mono_ms() + deadline_ms;
    }
    req_link(l, r);
    return 0;
}

int wk_alink_ping(wk_alink *l, uint64_t now_ns, const void *seed, size_t seed_len,
                  const char *name, uint32_t timeout_ms, wk_alink_ping_cb cb, void *arg)
{
    sf_ap_msg m = {.op = SF_AP_PING, .now_ns = now_ns, .seed = seed, .seed_len = seed_len,
                   .name = name};
    req *r;
    int rc;

    if (!l || !cb || (seed_len && (seed_len < SF_AP_SEED_MIN || seed_len > SF_AP_SEED_MAX)))
        return -EINVAL;
    if (!(r = calloc(1, sizeof(*r))))
        return -ENOMEM;
    r->kind = R_PING;
    r->ping_cb = cb;
    r->arg = arg;
    if ((rc = submit(l, r, &m, timeout_ms ? timeout_ms : TIMEOUT_DEFAULT)) < 0)
        req_free(r);
    return rc == -E2BIG ? -EINVAL : rc;
}

/* Queues the stdin of exec id right behind it: `input` frames of at most SF_AP_DATA_MAX
 * bytes, the last one with more = false (also when there is nothing: EOF at once). */
static int send_input(wk_alink *l, uint32_t id, const char *p, size_t len)
{
    sf_buf b;
    int rc = 0;
    size_t off = 0;

    sf_buf_init(&b, SF_AP_HDR_LEN + SF_AP_FRAME_MAX);
    do {
        size_t n = len - off > SF_AP_DATA_MAX ? SF_AP_DATA_MAX : len - off;
        sf_ap_msg m = {.op = SF_AP_INPUT, .id = id, .data = p + off, .data_len = n,
                       .more = off + n < len};
        b.len = 0;
        if ((rc = sf_ap_encode(&b, &m, NULL)) < 0 || bufferevent_write(l->bev, b.p, b.len) < 0) {
            rc = rc < 0 ? rc : -ENOMEM;
            break;
        }
        off += n;
    } while (off < len);
    sf_buf_fini(&b);
    return rc;
}

int wk_alink_exec(wk_alink *l, const wk_exec_req *req_in, wk_exec_cb cb, void *arg)
{
    sf_ap_msg m = {.op = SF_AP_EXEC};
    size_t env_n = 0;
    req *r;
    int rc;

    if (!l || !req_in || !req_in->command || !req_in->command[0] || !cb)
        return -EINVAL;
    while (req_in->env && req_in->env[env_n])
        if (++env_n > SF_AP_ENV_MAX)
            return -E2BIG;
    m.cmd = req_in->command;
    m.cwd = req_in->cwd && req_in->cwd[0] ? req_in->cwd : NULL;
    m.env = (const char *const *)req_in->env;
    m.env_n = env_n;
    m.timeout_ms = req_in->timeout_ms ? req_in->timeout_ms : TIMEOUT_DEFAULT;
    m.cap = req_in->cap_bytes ? req_in->cap_bytes : CAP_DEFAULT;
    if (m.cap > SF_AP_CAP_MAX)
        m.cap = SF_AP_CAP_MAX;
    if (m.cap < SF_AP_CAP_MIN)
        m.cap = SF_AP_CAP_MIN;
    if (!(r = calloc(1, sizeof(*r))))
        return -ENOMEM;
    if (req_in->has_stdin && (req_in->stdin_len > WK_EXEC_STDIN_MAX ||
                              (req_in->stdin_len && !req_in->stdin_data))) {
        free(r);
        return -E2BIG;
    }
    m.stream = req_in->on_output != NULL && !req_in->background;
    m.in = req_in->has_stdin;
    m.bg = req_in->background;
    if (req_in->pipe) { /* a duplex session: no timeout, stdin open until wk_alink_input's eof */
        if (!req_in->on_output || req_in->background)
            return -EINVAL;
        m.pipe = m.in = m.stream = 1;
        m.timeout_ms = UINT32_MAX;
    }
    r->bg = m.bg;
    if (!m.bg && req_in->detach_ms && req_in->detach_ms < m.timeout_ms)
        m.detach_ms = req_in->detach_ms;
    r->kind = R_EXEC;
    r->exec_cb = cb;
    r->output_cb = req_in->on_output;
    r->arg = arg;
    r->oom0 = l->oom ? l->oom(l->oom_arg) : 0;
    if ((rc = submit(l, r, &m, m.bg ? WK_ALINK_FILE_MS
                                    : (uint64_t)m.timeout_ms + WK_ALINK_GRACE_MS)) < 0) {
        req_free(r);
        return rc;
    }
    if (m.in && !m.pipe && !r->error && send_input(l, r->id, req_in->stdin_data, req_in->stdin_len) < 0) {
        /* Failed from the loop (never inside this call); the command, already sent, reads
         * what did go and is killed at its timeout; its late answer is ignored. */
        r->error = ERR_STDIN;
        arm(r, 0);
    }
    return 0;
}

int wk_alink_file(wk_alink *l, const wk_file_req *fr, wk_file_cb cb, void *arg)
{
    static const sf_ap_op op_of[] = {
        [WK_FILE_READ] = SF_AP_FREAD, [WK_FILE_WRITE] = SF_AP_FWRITE,
        [WK_FILE_LIST] = SF_AP_FLIST, [WK_FILE_MOVE] = SF_AP_FMOVE,
        [WK_FILE_DELETE] = SF_AP_FDEL, [WK_PROC_LIST] = SF_AP_PLIST,
        [WK_PROC_KILL] = SF_AP_PKILL, [WK_PROC_LOGS] = SF_AP_PLOGS,
    };
    sf_ap_msg m = {0};
    req *r;
    int rc;

    if (!l || !fr || !cb || (unsigned)fr->op > WK_PROC_LOGS)
        return -EINVAL;
    m.op = op_of[fr->op];
    m.path = fr->path;
    m.to = fr->to;
    m.off = fr->off;
    m.len = fr->len;
    m.flags = fr->flags;
    m.data = fr->data;
    m.data_len = fr->data_len;
    m.pid = fr->pid;
    m.sig = fr->sig;
    m.grace_ms = fr->grace_ms;
    m.tail = fr->tail;
    m.has_off = fr->has_off;
    if (!(r = calloc(1, sizeof(*r))))
        return -ENOMEM;
    r->kind = R_FILE;
    r->file_cb = cb;
    r->arg = arg;
    if ((rc = submit(l, r, &m, WK_ALINK_FILE_MS + (uint64_t)fr->grace_ms)) < 0)
        req_free(r);
    return rc == -E2BIG ? -EINVAL : rc;
}

int wk_alink_input(wk_alink *l, void *exec_arg, const char *data, size_t len, int eof)
{
    sf_buf b;
    size_t off = 0;
    int rc = 0;
    req *x;

    if (!l || (len && !data))
        return -EINVAL;
    for (x = l->reqs; x; x = x->next)
        if (x->kind == R_EXEC && x->arg == exec_arg && !x->error)
            break;
    if (!x || l->down)
        return -ENOENT;
    if (evbuffer_get_length(bufferevent_get_output(l->bev)) > WK_ALINK_INPUT_QUEUED_MAX)
        return -EAGAIN;
    sf_buf_init(&b, SF_AP_HDR_LEN + SF_AP_FRAME_MAX);
    do {
        size_t n = len - off > SF_AP_DATA_MAX ? SF_AP_DATA_MAX : len - off;
        sf_ap_msg m = {.op = SF_AP_INPUT, .id = x->id, .data = data + off, .data_len = n,
                       .more = !(eof && off + n == len)};
        b.len = 0;
        if ((rc = sf_ap_encode(&b, &m, NULL)) < 0 || bufferevent_write(l->bev, b.p, b.len) < 0) {
            rc = rc < 0 ? rc : -ENOMEM;
            break;
        }
        off += n;
    } while (off < len);
    sf_buf_fini(&b);
    return rc;
}

int wk_alink_cancel(wk_alink *l, void *exec_arg)
{
    sf_ap_msg m = {.op = SF_AP_CANCEL};
    req *r, *x;
    int rc;

    if (!l)
        return -EINVAL;
    for (x = l->reqs; x; x = x->next)
        if (x->kind == R_EXEC && x->arg == exec_arg && !x->error)
            break;
    if (!x)
        return -ENOENT;
    if (!(r = calloc(1, sizeof(*r))))
        return -ENOMEM;
    r->kind = R_CANCEL;
    m.target = x->id;
    if ((rc = submit(l, r, &m, WK_ALINK_FILE_MS)) < 0)
        req_free(r);
    return rc;
}

void wk_alink_first_id(wk_alink *l, uint32_t id)
{
    l->next_id = id ? id - 1 : 0;
}

void wk_alink_set_name(wk_alink *l, const char *name)
{
    if (l)
        snprintf(l->name, sizeof(l->name), "%s", name ? name : "?");
}

int wk_alink_pending(const wk_alink *l)
{
    return l ? l->n_reqs : 0;
}

void wk_alink_hold(wk_alink *l, int hold)
{
    uint64_t now = (uint64_t)sf_mono_ms();

    if (!l || l->held == !!hold)
        return;
    l->held = !!hold;
    for (req *r = l->reqs; r; r = r->next) {
        if (r->error)
            continue; /* answered from the loop at once anyway */
        if (hold) {
            evtimer_del(r->timer);
            r->deadline_ms = r->deadline_ms > now ? r->deadline_ms - now : 0;
        } else {
            arm(r, r->deadline_ms);
            r->deadline_ms += now;
        }
    }
}

int wk_alink_rebind(wk_alink *l, int fd)
{
    detach(l);
    l->down = NULL;
    return attach(l, fd);
}

void wk_alink_close(wk_alink *l, const char *error)
{
    if (!l)
        return;
    detach(l);
    if (!l->down)
        l->down = error;
    l->depth++;
    fail_all(l, error);
    l->depth--;
    release(l);
}

void wk_alink_free(wk_alink *l)
{
    if (!l || l->freed)
        return;
    l->freed = 1;
    detach(l);
    while (l->reqs) {
        req *r = l->reqs;
        req_unlink(l, r);
        req_free(r);
    }
    release(l);
}
