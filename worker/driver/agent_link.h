/* wk_alink: the worker's end of one agent connection (schemas/agent-protocol.md)
 * on libevent, for any transport that is a stream socket (the qemu driver's
 * virtio-serial chardev; the jail's socketpair works the same way).
 *
 * Requests (ping, exec, file requests, cancel) are matched to replies by id; a streamed
 * exec's output chunks go to its output callback before its result. Each has a worker-side
 * deadline (exec: its timeout + WK_ALINK_GRACE_MS): the agent enforces the
 * command's timeout itself, so a missed deadline means the agent or its VM
 * stopped answering; the request fails and the owner's stall callback runs.
 * Everything the agent sends is untrusted: a frame that does not decode, or a
 * request-type frame, ends the link like EOF does.
 *
 * Loop thread only. Callbacks run from the loop, never inside the call that
 * queued the request (wk_alink_fail_all runs them at once, by design). */
#ifndef WK_AGENT_LINK_H
#define WK_AGENT_LINK_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"

#define WK_ALINK_GRACE_MS 5000  /* exec deadline = timeout + this */
#define WK_ALINK_EXECS_MAX 64   /* concurrent execs (the agent runs 64 commands) */
#define WK_ALINK_REQS_MAX 128   /* concurrent requests of every kind */
#define WK_ALINK_FILE_MS 30000  /* deadline of a file request or a cancel */

typedef struct wk_alink wk_alink;

/* rc 0: the agent answered with our protocol version. */
typedef void (*wk_alink_ping_cb)(void *arg, int rc, const char *why);
/* A request passed its deadline unanswered, or the link broke (EOF, garbage): the
 * agent is unreachable. Runs once per event, after the affected callbacks. */
typedef void (*wk_alink_down_cb)(void *arg, const char *why);

/* Takes fd (a connected stream socket; made non-blocking). NULL when out of memory
 * (fd is then closed). name is for log lines (a sandbox id). */
wk_alink *wk_alink_new(struct event_base *base, int fd, const char *name);
void wk_alink_on_down(wk_alink *l, wk_alink_down_cb cb, void *arg);
/* Optional: fn(arg) counts the sandbox's OOM kills so far; an exec's result then says
 * oom_killed when the count grew while it ran (else the agent's own oom_killed). */
void wk_alink_oom_probe(wk_alink *l, uint64_t (*fn)(void *arg), void *arg);

/* Sends a ping carrying the optional now (Unix ns, 0 = none), seed (16-256 bytes,
 * or NULL) and name (hostname, or NULL); cb once. -ENOMEM, -EBUSY, -EPIPE (link
 * down), -EINVAL (bad fields). */
int wk_alink_ping(wk_alink *l, uint64_t now_ns, const void *seed, size_t seed_len,
                  const char *name, uint32_t timeout_ms, wk_alink_ping_cb cb, void *arg);

/* As driver.h's exec: cb exactly once; -EINVAL, -E2BIG, -EBUSY, -ENOMEM. When the
 * link is down the request fails from the loop with the link's error. */
int wk_alink_exec(wk_alink *l, const wk_exec_req *req, wk_exec_cb cb, void *arg);

/* As driver.h's file: one request, cb exactly once; -EINVAL, -EBUSY, -ENOMEM. */
int wk_alink_file(wk_alink *l, const wk_file_req *req, wk_file_cb cb, void *arg);

/* As driver.h's exec_input: more stdin for the pipe exec whose callback argument is
 * exec_arg. -ENOENT (no such exec), -EAGAIN (over WK_ALINK_INPUT_QUEUED_MAX bytes wait
 * for the agent already), -ENOMEM. */
#define WK_ALINK_INPUT_QUEUED_MAX (8u << 20)
int wk_alink_input(wk_alink *l, void *exec_arg, const char *data, size_t len, int eof);
/* As driver.h's exec_cancel: the agent kills the process group of the exec whose callback
 * argument is exec_arg; that exec then answers as a killed command. -ENOENT (no such exec
 * in flight), -EBUSY, -ENOMEM. */
int wk_alink_cancel(wk_alink *l, void *exec_arg);

/* The id of its next request (a link to an agent an earlier worker talked to: ids of
 * another range than that worker's). */
void wk_alink_first_id(wk_alink *l, uint32_t id);
/* The name in its log lines (a sandbox id). */
void wk_alink_set_name(wk_alink *l, const char *name);

/* Requests waiting for their answer. */
int wk_alink_pending(const wk_alink *l);

/* Stops (hold = 1) or restarts (hold = 0) the deadline clocks, e.g. while the VM is
 * paused: a stopped guest cannot answer, and its own clock stands still too. */
void wk_alink_hold(wk_alink *l, int hold);

/* Moves the link to a new connection (a VM restored from disk answers on a new
 * socket): takes fd; what the old one still held is dropped. 0 or -ENOMEM (fd closed). */
int wk_alink_rebind(wk_alink *l, int fd);

/* Fails every pending request with error (callbacks run now, in this call) and makes
 * later ones fail with it too; closes the connection. error must stay valid (a
 * static string). */
void wk_alink_close(wk_alink *l, const char *error);

/* Closes and frees; pending requests get no callback (call wk_alink_close first to
 * answer them). NULL-safe; allowed from inside a callback of this link. */
void wk_alink_free(wk_alink *l);

#endif
