/* The worker's side of the agent protocol (schemas/agent-protocol.md): one
 * libevent bufferevent per sandbox on the socketpair, requests matched to
 * replies by id, a worker-side deadline per exec (the agent enforces the
 * command timeout; this catches an agent that stopped answering).
 *
 * Everything the agent sends is untrusted: a frame that does not decode, or a
 * request-type frame, marks the agent as gone like EOF does. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_agentproto.h"
#include "sf_log.h"
#include "sf_util.h"

#define ERR_AGENT_GONE                                                                            \
    "The sandbox's agent stopped (its init process exited); kill this sandbox and create a new one."
#define ERR_AGENT_BAD                                                                             \
    "The sandbox's agent sent an invalid message; kill this sandbox and create a new one."
#define ERR_NO_ANSWER                                                                             \
    "The sandbox did not answer within the command's timeout; it may be overloaded: retry, or "    \
    "kill and recreate it."

struct wk_req {
    wk_req *next, *prev;
    wk_sandbox *sb;
    uint32_t id;
    wk_exec_cb cb;
    void *arg;
    struct event *timer;
    const char *error; /* set when the request can only fail (agent already gone) */
    uint64_t oom0;     /* the box's OOM kills when the command started */
};

void wk_sandbox_release(wk_sandbox *sb)
{
    if (sb->killed && sb->depth == 0)
        free(sb);
}

static void req_unlink(wk_sandbox *sb, wk_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        sb->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    sb->n_reqs--;
}

static void req_link(wk_sandbox *sb, wk_req *r)
{
    r->prev = NULL;
    r->next = sb->reqs;
    if (sb->reqs)
        sb->reqs->prev = r;
    sb->reqs = r;
    sb->n_reqs++;
}

/* Runs the callback once and frees the request. */
static void req_complete(wk_sandbox *sb, wk_req *r, const wk_exec_result *res)
{
    req_unlink(sb, r);
    if (r->timer)
        event_free(r->timer);
    sb->depth++;
    r->cb(r->arg, res);
    sb->depth--;
    free(r);
}

static void req_fail(wk_sandbox *sb, wk_req *r, const char *error)
{
    wk_exec_result res = {.exit_code = -1, .error = r->error ? r->error : error};
    req_complete(sb, r, &res);
}

void wk_agent_fail_all(wk_sandbox *sb, const char *error)
{
    while (sb->reqs)
        req_fail(sb, sb->reqs, error);
}

void wk_agent_detach(wk_sandbox *sb)
{
    if (sb->bev) {
        bufferevent_free(sb->bev);
        sb->bev = NULL;
    }
}

static void agent_gone(wk_sandbox *sb, const char *error, const char *detail)
{
    if (sb->dead)
        return;
    sb->dead = error;
    if (!sb->killed)
        sf_warn("msg=\"sandbox agent gone\" sandbox=%s why=\"%s\"", sb->id, detail);
    wk_agent_detach(sb);
    wk_agent_fail_all(sb, error);
}

static wk_req *req_find(wk_sandbox *sb, uint32_t id)
{
    for (wk_req *r = sb->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

static void handle_msg(wk_sandbox *sb, const sf_ap_msg *m)
{
    wk_exec_result res = {0};
    wk_req *r;

    switch (m->op) {
    case SF_AP_RESULT:
    case SF_AP_ERROR:
        if (!(r = req_find(sb, m->id)) || r->error) {
            /* late (the worker-side deadline passed) or never asked */
            sf_debug("msg=\"agent reply without a request\" sandbox=%s id=%u op=%s", sb->id,
                     m->id, sf_ap_op_name(m->op));
            return;
        }
        if (m->op == SF_AP_ERROR) {
            res.exit_code = -1;
            res.error = m->msg;
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
            res.oom_killed = wk_cgroup_oom_kills(&sb->cg) > r->oom0;
        }
        req_complete(sb, r, &res);
        return;
    case SF_AP_PONG:
        return;
    default:
        agent_gone(sb, ERR_AGENT_BAD, "the agent sent a request-type frame");
        return;
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    wk_sandbox *sb = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    sb->depth++;
    while (sb->bev && !sb->killed) {
        unsigned char hdr[SF_AP_HDR_LEN];
        const char *why = NULL;
        size_t flen;
        sf_ap_msg m;
        unsigned char *p;

        if (evbuffer_copyout(in, hdr, sizeof(hdr)) < (ev_ssize_t)sizeof(hdr))
            break;
        if (sf_ap_frame_check(hdr, sizeof(hdr), &flen, &why) < 0) {
            agent_gone(sb, ERR_AGENT_BAD, why);
            break;
        }
        flen = SF_AP_HDR_LEN + ((size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 |
                                (size_t)hdr[2] << 8 | hdr[3]);
        if (evbuffer_get_length(in) < flen)
            break;
        if (!(p = evbuffer_pullup(in, (ev_ssize_t)flen))) {
            agent_gone(sb, ERR_AGENT_BAD, "out of memory");
            break;
        }
        if (sf_ap_decode(p + SF_AP_HDR_LEN, flen - SF_AP_HDR_LEN, &m, &why) < 0) {
            sf_error("msg=\"bad frame from agent\" sandbox=%s why=\"%s\"", sb->id, why);
            agent_gone(sb, ERR_AGENT_BAD, why);
            break;
        }
        evbuffer_drain(in, flen);
        handle_msg(sb, &m);
        sf_ap_msg_fini(&m);
    }
    sb->depth--;
    wk_sandbox_release(sb);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    wk_sandbox *sb = arg;

    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    sb->depth++;
    agent_gone(sb, ERR_AGENT_GONE, what & BEV_EVENT_EOF ? "EOF on the agent socket"
                                                         : "error on the agent socket");
    sb->depth--;
    wk_sandbox_release(sb);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    wk_req *r = arg;
    wk_sandbox *sb = r->sb;

    sb->depth++;
    if (!r->error)
        sf_warn("msg=\"exec deadline passed without an answer\" sandbox=%s id=%u", sb->id, r->id);
    req_fail(sb, r, ERR_NO_ANSWER);
    sb->depth--;
    wk_sandbox_release(sb);
}

int wk_agent_attach(wk_sandbox *sb, int fd)
{
    if (evutil_make_socket_nonblocking(fd) < 0 ||
        !(sb->bev = bufferevent_socket_new(sb->base, fd, BEV_OPT_CLOSE_ON_FREE)))
        return -ENOMEM;
    bufferevent_setcb(sb->bev, on_read, NULL, on_event, sb);
    if (bufferevent_enable(sb->bev, EV_READ | EV_WRITE) < 0) {
        bufferevent_free(sb->bev);
        sb->bev = NULL;
        return -EIO;
    }
    return 0;
}

int wk_agent_ping(int fd, int timeout_ms, const char **why)
{
    sf_ap_msg ping = {.op = SF_AP_PING, .id = 1}, m;
    unsigned char in[256];
    size_t got = 0, flen = 0, off = 0;
    int64_t deadline = sf_mono_ms() + timeout_ms;
    sf_buf b;
    int rc;

    sf_buf_init(&b, 64);
    if ((rc = sf_ap_encode(&b, &ping, why)) < 0)
        goto out;
    while (off < b.len) {
        ssize_t n = send(fd, b.p + off, b.len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = -EPIPE;
            *why = "The sandbox's agent exited right after starting; check agent_path.";
            goto out;
        }
        off += (size_t)n;
    }
    /* A pong is a few bytes: anything that does not fit is not a pong. */
    while (flen == 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - sf_mono_ms();
        int ready = left > 0 ? poll(&p, 1, (int)left) : 0;
        ssize_t n;

        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0) {
            rc = -ETIMEDOUT;
            *why = "The sandbox's agent did not answer its first ping within 5 seconds; the host may be overloaded.";
            goto out;
        }
        n = read(fd, in + got, sizeof(in) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = -EPIPE;
            *why = "The sandbox's agent exited right after starting; check agent_path.";
            goto out;
        }
        got += (size_t)n;
        if (sf_ap_frame_check(in, got, &flen, why) < 0 || (flen == 0 && got == sizeof(in))) {
            rc = -EBADMSG;
            *why = "The sandbox's agent answered the ping with garbage; rebuild sandfleet-agent.";
            goto out;
        }
    }
    if (flen != got || sf_ap_decode(in + SF_AP_HDR_LEN, flen - SF_AP_HDR_LEN, &m, why) < 0) {
        rc = -EBADMSG;
        *why = "The sandbox's agent answered the ping with garbage; rebuild sandfleet-agent.";
        goto out;
    }
    if (m.op != SF_AP_PONG || m.id != ping.id || m.version != SF_AP_VERSION) {
        rc = -EPROTO;
        *why = "The sandbox's agent speaks another protocol version; rebuild sandfleet-agent with the worker.";
    }
    sf_ap_msg_fini(&m);
out:
    sf_buf_fini(&b);
    return rc;
}

int wk_jail_exec(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg)
{
    sf_ap_msg m = {.op = SF_AP_EXEC};
    struct timeval tv = {0, 0};
    uint64_t deadline;
    const char *why;
    size_t env_n = 0;
    wk_req *r;
    sf_buf b;
    int rc;

    if (!sb || !req || !req->command || !req->command[0] || !cb)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (sb->n_reqs >= WK_EXECS_MAX)
        return -EBUSY;
    while (req->env && req->env[env_n])
        if (++env_n > SF_AP_ENV_MAX)
            return -E2BIG;
    if (!(r = calloc(1, sizeof(*r))))
        return -ENOMEM;
    r->sb = sb;
    r->cb = cb;
    r->arg = arg;
    if (++sb->next_id == 0)
        sb->next_id = 1;
    r->id = sb->next_id;
    if (!(r->timer = evtimer_new(sb->base, on_deadline, r))) {
        free(r);
        return -ENOMEM;
    }
    if (sb->dead) {
        /* Answer from the loop, not from inside this call. */
        r->error = sb->dead;
        evtimer_add(r->timer, &tv);
        req_link(sb, r);
        return 0;
    }
    r->oom0 = wk_cgroup_oom_kills(&sb->cg);
    m.id = r->id;
    m.cmd = req->command;
    m.cwd = req->cwd && req->cwd[0] ? req->cwd : NULL; /* "" = the default, /root */
    m.env = (const char *const *)req->env;
    m.env_n = env_n;
    m.timeout_ms = req->timeout_ms ? req->timeout_ms : WK_TIMEOUT_DEFAULT;
    m.cap = req->cap_bytes ? req->cap_bytes : WK_CAP_DEFAULT;
    if (m.cap > SF_AP_CAP_MAX)
        m.cap = SF_AP_CAP_MAX;
    if (m.cap < SF_AP_CAP_MIN)
        m.cap = SF_AP_CAP_MIN;
    sf_buf_init(&b, SF_AP_HDR_LEN + SF_AP_FRAME_MAX);
    rc = sf_ap_encode(&b, &m, &why);
    if (rc == 0 && bufferevent_write(sb->bev, b.p, b.len) < 0)
        rc = -ENOMEM;
    sf_buf_fini(&b);
    if (rc < 0) {
        event_free(r->timer);
        free(r);
        return rc == -EMSGSIZE ? -E2BIG : rc;
    }
    deadline = (uint64_t)m.timeout_ms + WK_EXEC_GRACE_MS;
    tv.tv_sec = (time_t)(deadline / 1000);
    tv.tv_usec = (suseconds_t)(deadline % 1000) * 1000;
    evtimer_add(r->timer, &tv);
    req_link(sb, r);
    return 0;
}
