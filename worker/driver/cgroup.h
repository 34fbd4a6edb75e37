/* cgroup.c: per-worker parent cgroups (caps on the total) and per-sandbox groups with
 * their limits, v2 or v1 (see cgroup.c). Used by the jail driver and, for its QEMU
 * processes, by the qemu driver. */
#ifndef WK_CGROUP_H
#define WK_CGROUP_H

#include <stdint.h>

#include "driver.h"

enum { WK_CG_MEMORY, WK_CG_PIDS, WK_CG_FREEZER, WK_CG_CPU, WK_CG_CPUACCT, WK_CG_CPUSET, WK_CG_N };

#define WK_AGENT_RESERVE (32ull << 20) /* memory of a sandbox kept for its agent (at most) */
#define WK_TCP_SHARE 8                 /* v1: TCP buffers may use memory/8 beside memory */

typedef struct wk_cgroup {
    int v2;
    char dir[WK_CG_N][320];   /* the sandbox's group per v1 hierarchy, "" when absent;
                                 v2: dir[0] only */
    char box[336];            /* the commands' memory group (v1 memory/<id>/box, v2 <id>/box) */
    char agent[336];          /* v2: the agent's leaf <id>/agent; v1 "" (it stays in <id>) */
    int fd;                   /* v2: fd of agent/ for CLONE_INTO_CGROUP, else -1 */
} wk_cgroup;

/* What a worker's sandboxes may use together (its parent group's limits). */
typedef struct wk_cg_caps {
    uint64_t mem_bytes;       /* memory (v2: with TCP buffers) */
    uint64_t tcp_bytes;       /* v1: TCP buffers */
    uint64_t vcpu_milli;      /* CPU time, 1000 = one core */
} wk_cg_caps;

/* Detects v2 (memory, pids, cpu at the root) or v1 (memory, pids, cpu, optional
 * freezer and cpuacct; cached) and creates the `sandfleet/<host>` parents, with the
 * caps when given. */
int wk_cgroup_host_init(const char *host, const wk_cg_caps *caps, const char **why);
int wk_cgroup_is_v2(void);
/* v1 with memory.kmem.tcp: TCP buffers are limited apart from memory. */
int wk_cgroup_tcp_apart(void);
/* Tests only: a plain directory stands for /sys/fs/cgroup (v2 when it holds a
 * cgroup.controllers file listing memory, pids and cpu; v1 when it has memory/, pids/,
 * cpu/ directories). Files are created as written. */
int wk_cgroup_fake(const char *root);
/* Creates the sandbox's groups under sandfleet/<host>/<id> with its limits. */
int wk_cgroup_create(wk_cgroup *cg, const char *host, const char *id, const wk_limits *lim,
                     const char **why);
/* Opens, write-only and close-on-exec, the file through which the agent's commands
 * join the box (*box_fd) and, v1, every group's `tasks` file for the jail child, which
 * moves itself by writing "0". Moving the writer's own thread skips the global
 * threadgroup lock that moving a pid takes (an RCU grace period, 10-20 ms). v2: fds
 * all -1 (the child is born inside through CLONE_INTO_CGROUP). */
int wk_cgroup_open_tasks(const wk_cgroup *cg, int fds[WK_CG_N], int *box_fd);
/* OOM kills in the box so far (memory.oom_control / memory.events), 0 if unknown. *fd
 * keeps that file open between calls (-1: not yet; it is read again from offset 0, as
 * opening a cgroup file walks its path, the larger cost per exec); the caller closes it. */
uint64_t wk_cgroup_oom_kills(const wk_cgroup *cg, int *fd);
/* Thaws the group (a frozen task cannot die; also resume). */
void wk_cgroup_thaw(const wk_cgroup *cg);
/* Pause: asks the freezer to stop every task of the sandbox. 0, -ENOTSUP (no freezer
 * on this host), -errno. Freezing takes a few ms: poll wk_cgroup_frozen. */
int wk_cgroup_freeze(const wk_cgroup *cg);
/* 1 once every task is stopped, 0 while freezing, -errno. */
int wk_cgroup_frozen(const wk_cgroup *cg);
/* Thaws, kills what is left inside, removes the groups. Idempotent. 0 or the
 * first rmdir error. */
int wk_cgroup_destroy(wk_cgroup *cg);
/* Fills cg for an existing sandbox id (cleanup after a restart). */
void wk_cgroup_lookup(wk_cgroup *cg, const char *host, const char *id);
/* The agent's share of a sandbox's memory; v1 TCP limit for a sandbox's memory;
 * cpu.shares and cpu.weight for a CPU share. */
uint64_t wk_agent_reserve(uint64_t memory);
uint64_t wk_tcp_limit(uint64_t memory);
uint32_t wk_cpu_shares(uint32_t vcpu_milli);
uint32_t wk_cpu_weight(uint32_t vcpu_milli);

#endif
