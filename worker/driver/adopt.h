/* adopt.c: what both drivers need to take a sandbox of an earlier worker run back
 * (docs/internals/restart.md): the host-only folder state_dir/adopt/<id>/, a process's
 * start time and cgroup from /proc, and a blocking first ping of a kept agent. */
#ifndef WK_ADOPT_H
#define WK_ADOPT_H

#include <stdint.h>
#include <sys/types.h>

#define WK_ADOPT_DIR "adopt"
#define WK_ADOPT_PING_MS 5000 /* a kept sandbox's agent answers a new worker within this */
/* What a call still waiting on a kept sandbox is told when its worker stops. */
#define SF_MSG_WORKER_STOPPING                                                               \
    "The host's worker stopped while this ran (a restart or an upgrade); the sandbox goes "  \
    "on, but this call's outcome is unknown: check its effect, then retry."

/* Opens state_dir/adopt (made if missing when make) checked: root's, mode 0700 at most,
 * no link. fd or -errno. */
int wk_adopt_root(const char *state_dir, int make);
/* Opens the folder name under the folder fd parent (AT_FDCWD: a path; made first, mode
 * 0700, when make) checked: root's, mode 0700 at most, no link at its last component.
 * fd or -errno. */
int wk_root_dir_open(int parent, const char *name, int make);
/* state_dir/adopt/<id> (id checked) opened and checked the same way. fd or -errno. */
int wk_adopt_dir(const char *state_dir, const char *id, int make);
/* /proc/PID/stat: the start time (field 22, clock ticks since boot) and the state letter
 * (field 3). 0, or -ESRCH. */
int wk_proc_stat(pid_t pid, unsigned long long *start, char *state);
/* 1 when pid's cgroup is sandfleet/<host>/<name> (or below it). */
int wk_proc_in_cgroup(pid_t pid, const char *host, const char *name);
/* Sends a ping on the (blocking) socket to a sandbox's agent and waits for the pong. 0 or
 * -errno with why. */
int wk_agent_ping(int fd, int timeout_ms, const char **why);

#endif
