/* The sandbox driver interface, as implemented by the `jail` driver
 * (worker/jail*.c, worker/cgroup.c, worker/template.c; see worker/README.md).
 *
 * A jail sandbox is a process tree in fresh user, pid, mount, net, ipc, uts and
 * cgroup namespaces, rooted (pivot_root) in an overlay of the busybox template,
 * under no-new-privs, a seccomp deny-list and memory/pids cgroup limits. Its
 * pid 1 is the guest agent (worker/agent/agent.c), which the worker drives over
 * a socketpair (schemas/agent-protocol.md).
 *
 * Not thread-safe: call everything from the worker's event-loop thread. The
 * process must ignore SIGPIPE (sf_daemon does): a dying agent closes its socket
 * under pending writes. Leave SIGCHLD at its default: the driver reaps the
 * jails it starts (through pidfds).
 * Functions return 0 or a negative errno; `why` gets one actionable sentence
 * (a static string). */
#ifndef WK_SANDBOX_H
#define WK_SANDBOX_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wk_jail_opts {
    const char *state_dir;      /* absolute; sandboxes/<id>/ and templates/ live under it */
    const char *agent_path;     /* host path of the static sandfleet-agent, bind-mounted
                                   read-only at /sbin/sandfleet-agent in every sandbox */
    uint64_t memory_bytes;      /* memory limit; 0 = 512 MiB */
    int pids_max;               /* process limit; <= 0 = 256 */
    uint32_t uid_base;          /* sandbox slot s maps its uids/gids 0..65535 to host
                                   uid_base + s*65536 ...; 0 = 200000. Must be >= 65536. */
} wk_jail_opts;

typedef struct wk_sandbox wk_sandbox;

typedef struct wk_exec_req {
    const char *command;        /* run as /bin/sh -c command */
    const char *cwd;            /* NULL = /root; a missing cwd gives an error result */
    const char *const *env;     /* NULL or NULL-terminated "K=V" array (<= 256), added to
                                   PATH, HOME=/root, TERM=xterm (same key overrides) */
    uint32_t timeout_ms;        /* 0 = 60000; the caller clamps (max 600000) */
    uint32_t cap_bytes;         /* per-stream cap, 0 = 32768 (2..262144): head cap/2 +
                                   tail cap - cap/2 are kept */
} wk_exec_req;

typedef struct wk_exec_result {
    int exit_code;              /* exit status, 128+signal when killed by a signal, -1 on timeout */
    int timed_out;              /* 1: killed (the whole process group) after timeout_ms */
    const char *out;            /* kept stdout bytes: head then tail, raw join, no marker */
    size_t out_len;
    uint64_t out_total;         /* bytes the command wrote to stdout */
    const char *err;
    size_t err_len;
    uint64_t err_total;
    int truncated;              /* 1 if either stream was cut */
    uint32_t duration_ms;
    const char *error;          /* non-NULL when the command could not run at all (bad cwd,
                                   agent gone, sandbox killed...): one actionable sentence;
                                   the other fields are then unset */
} wk_exec_result;

typedef void (*wk_exec_cb)(void *arg, const wk_exec_result *res); /* res valid only during the call */

/* One-time host setup: builds the busybox template rootfs under
 * state_dir/templates/base/rootfs if missing, checks cgroup support (v2 when
 * /sys/fs/cgroup/cgroup.controllers has memory and pids, else v1 memory + pids
 * (+ freezer)), creates the `sandfleet` parent cgroups and compiles the seccomp
 * filter. Needs root. 0 or negative errno + *why. */
int wk_jail_host_init(const wk_jail_opts *o, const char **why);

/* Creates and starts sandbox `id` ([a-z0-9_-]{1,63}); returns once the agent
 * inside answered a ping. The agent connection is then driven by `base`.
 * -EINVAL (bad id/opts), -EEXIST (id in use), -EAGAIN (no free uid slot), or the
 * errno of the failed step; *why says what to do. */
int wk_jail_create(struct event_base *base, const wk_jail_opts *o, const char *id,
                   wk_sandbox **out, const char **why);

/* Runs a command asynchronously; cb is called exactly once, never from inside
 * this call (also when the agent is gone: res->error says so; and on kill:
 * res->error = "The sandbox was killed while the command ran.").
 * -EINVAL (no command/cb, bad env entry), -E2BIG (request over the 1 MiB frame
 * or more than 256 env entries), -EBUSY (64 commands already running),
 * -ESRCH (the sandbox is being killed), -ENOMEM. */
int wk_sandbox_exec(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg);

/* Tears everything down synchronously: pending exec callbacks fire first, then
 * SIGKILL of the jail's init (the kernel ends the pid namespace) and reap, the
 * cgroups and the sandbox directory go. Safe to call from an exec callback.
 * NULL-safe. */
void wk_sandbox_kill(wk_sandbox *sb);

const char *wk_sandbox_id(const wk_sandbox *sb);

/* Kills what a previous worker run left under state_dir: every
 * sandboxes/<id>/ (its cgroups' processes, the cgroups, the directory) and
 * unfinished template builds. Call before wk_jail_host_init at start-up. */
void wk_jail_host_cleanup(const wk_jail_opts *o);

#endif
