/* cgroups for jail sandboxes. Under a `sandfleet/<host_id>` parent per worker, whose
 * limits cap what all its sandboxes together may use (so the platform's own daemons
 * keep room), each sandbox has a group <id> with its limits and, for memory, two
 * children: the agent stays in <id> itself (v2: <id>/agent), the commands it runs join
 * <id>/box, which is limited to the sandbox's memory minus a small reserve for the
 * agent. An OOM inside the box therefore never chooses the agent.
 *
 *   v2 (when /sys/fs/cgroup is cgroup2 and lists memory, pids and cpu):
 *      sandfleet/<host>: memory.max, cpu.max
 *      sandfleet/<host>/<id>: memory.max (total), pids.max, cpu.max, cpu.weight,
 *        cgroup.freeze, cgroup.kill; agent/ (the agent, born there through
 *        CLONE_INTO_CGROUP); box/: memory.max, memory.swap.max=0 (TCP buffers and
 *        kernel memory are charged to memory on v2)
 *   v1 (hybrid or legacy): <ctrl>/sandfleet/<host>/<id> for memory, pids, freezer,
 *        cpu, cpuacct, cpuset (the parent's CPUs; lxcfs finds the quota through it):
 *        memory.limit_in_bytes (+ memsw), memory.kmem.tcp.limit_in_bytes
 *        (v1 charges TCP buffers apart from memory), pids.max, cpu.cfs_quota_us,
 *        cpu.shares; memory/<id>/box for the commands. The jail's first process moves
 *        itself into each group through `tasks` files the worker opened.
 *
 * A fake root (wk_cgroup_fake, tests only) replaces /sys/fs/cgroup with a plain
 * directory: files are created as written and removed before their directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "fs.h"
#include "sf_util.h"

#define CG_PARENT "sandfleet"
#define CPU_PERIOD_US 100000

static char cg_root[128] = "/sys/fs/cgroup";
static int cg_fake;      /* tests: a plain directory stands for cgroupfs */
static int cg_mode = -1; /* -1 unknown, 0 v1, 1 v2 */
static int cg_have[WK_CG_N];
static int cg_tcp;       /* v1 memory.kmem.tcp.limit_in_bytes exists */
static uint64_t cg_quota_cap; /* v1: the parent's CPU quota (us per period); a child's
                                 quota may not exceed it there */

static const char *const v1_ctrl[WK_CG_N] = {"memory", "pids", "freezer", "cpu", "cpuacct",
                                             "cpuset"};

static int write_str(const char *dir, const char *file, const char *s)
{
    char path[WK_PATH_MAX];
    size_t len = strlen(s);
    int fd, n = snprintf(path, sizeof(path), "%s/%s", dir, file);
    ssize_t w;

    if (n < 0 || (size_t)n >= sizeof(path))
        return -ENAMETOOLONG;
    if ((fd = open(path, O_WRONLY | O_CLOEXEC | (cg_fake ? O_CREAT | O_TRUNC : 0), 0644)) < 0)
        return -errno;
    w = write(fd, s, len);
    n = w == (ssize_t)len ? 0 : w < 0 ? -errno : -EIO;
    close(fd);
    return n;
}

static int write_u64(const char *dir, const char *file, uint64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%llu", (unsigned long long)v);
    return write_str(dir, file, s);
}

static ssize_t read_str(const char *dir, const char *file, char *buf, size_t size)
{
    char path[WK_PATH_MAX];
    int fd, n = snprintf(path, sizeof(path), "%s/%s", dir, file);
    ssize_t r, got = 0;

    if (n < 0 || (size_t)n >= sizeof(path))
        return -ENAMETOOLONG;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    while ((size_t)got < size - 1 && (r = read(fd, buf + got, size - 1 - (size_t)got)) > 0)
        got += r;
    buf[got] = '\0';
    close(fd);
    return got;
}

/* v1 cpuset: a new group has no CPUs or memory nodes until given its parent's. The
 * sandbox has a cpuset group at the same path as its other groups because lxcfs reads
 * the CPU quota at the path of the reader's cpuset group. */
static int cpuset_inherit(const char *dir)
{
    static const char *const files[] = {"cpuset.cpus", "cpuset.mems"};
    char parent[WK_PATH_MAX], val[512];
    char *slash;
    int rc;

    snprintf(parent, sizeof(parent), "%s", dir);
    if (!(slash = strrchr(parent, '/')))
        return -EINVAL;
    *slash = '\0';
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        if (read_str(parent, files[i], val, sizeof(val)) < 0)
            return -EIO;
        val[strcspn(val, "\n")] = '\0';
        if (!val[0])
            return -EIO;
        if ((rc = write_str(dir, files[i], val)) < 0)
            return rc;
    }
    return 0;
}

static int is_fs(const char *path, long magic)
{
    struct statfs sf;
    return statfs(path, &sf) == 0 && (long)sf.f_type == magic;
}

static int has_word(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ' || p[n] == '\n'))
            return 1;
    return 0;
}

static int same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

static int detect(const char **why)
{
    char ctrl[512], p[300], q[300];

    if (cg_mode >= 0)
        return 0;
    if ((cg_fake || is_fs(cg_root, CGROUP2_SUPER_MAGIC)) &&
        read_str(cg_root, "cgroup.controllers", ctrl, sizeof(ctrl)) >= 0 &&
        has_word(ctrl, "memory") && has_word(ctrl, "pids") && has_word(ctrl, "cpu")) {
        cg_mode = 1;
        return 0;
    }
    for (int c = 0; c < WK_CG_N; c++) {
        snprintf(p, sizeof(p), "%s/%s", cg_root, v1_ctrl[c]);
        cg_have[c] = cg_fake ? access(p, F_OK) == 0 : is_fs(p, CGROUP_SUPER_MAGIC);
    }
    /* cpu and cpuacct mounted together (cpu,cpuacct): one hierarchy, one group */
    snprintf(p, sizeof(p), "%s/cpu", cg_root);
    snprintf(q, sizeof(q), "%s/cpuacct", cg_root);
    if (cg_have[WK_CG_CPU] && cg_have[WK_CG_CPUACCT] && same_dir(p, q))
        cg_have[WK_CG_CPUACCT] = 0;
    if (cg_have[WK_CG_MEMORY] && cg_have[WK_CG_PIDS] && cg_have[WK_CG_CPU]) {
        snprintf(p, sizeof(p), "%s/memory/memory.kmem.tcp.limit_in_bytes", cg_root);
        cg_tcp = access(p, F_OK) == 0;
        cg_mode = 0;
        return 0;
    }
    *why = "No usable cgroups: need cgroup v2 with the memory, pids and cpu controllers at "
           "/sys/fs/cgroup, or cgroup v1 memory, pids and cpu hierarchies under /sys/fs/cgroup.";
    return -ENOTSUP;
}

int wk_cgroup_fake(const char *root)
{
    if (snprintf(cg_root, sizeof(cg_root), "%s", root) >= (int)sizeof(cg_root))
        return -ENAMETOOLONG;
    cg_fake = 1;
    cg_mode = -1;
    return 0;
}

int wk_cgroup_is_v2(void)
{
    return cg_mode == 1;
}

int wk_cgroup_tcp_apart(void)
{
    return cg_mode == 0 && cg_tcp;
}

static int parent_dir(char *buf, size_t n, int c, const char *host)
{
    int r = cg_mode == 1 ? snprintf(buf, n, "%s/" CG_PARENT "/%s", cg_root, host)
                         : snprintf(buf, n, "%s/%s/" CG_PARENT "/%s", cg_root, v1_ctrl[c], host);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static int mkdir_ok(const char *path)
{
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -errno;
}

int wk_cgroup_host_init(const char *host, const wk_cg_caps *caps, const char **why)
{
    char dir[300];
    int rc;

    if ((rc = detect(why)) < 0)
        return rc;
    if (cg_mode == 1) {
        snprintf(dir, sizeof(dir), "%s/" CG_PARENT, cg_root);
        if ((rc = mkdir_ok(dir)) < 0)
            goto fail;
        /* The root already delegates when the controllers are listed there. */
        write_str(cg_root, "cgroup.subtree_control", "+memory +pids +cpu");
        if ((rc = write_str(dir, "cgroup.subtree_control", "+memory +pids +cpu")) < 0)
            goto delegate;
        parent_dir(dir, sizeof(dir), 0, host);
        if ((rc = mkdir_ok(dir)) < 0)
            goto fail;
        if ((rc = write_str(dir, "cgroup.subtree_control", "+memory +pids +cpu")) < 0)
            goto delegate;
        if (caps) {
            char cpu[64];
            snprintf(cpu, sizeof(cpu), "%llu %d",
                     (unsigned long long)caps->vcpu_milli * CPU_PERIOD_US / 1000, CPU_PERIOD_US);
            if ((rc = write_u64(dir, "memory.max", caps->mem_bytes)) < 0 ||
                (rc = write_str(dir, "cpu.max", cpu)) < 0)
                goto limits;
        }
        return 0;
    }
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg_have[c])
            continue;
        snprintf(dir, sizeof(dir), "%s/%s/" CG_PARENT, cg_root, v1_ctrl[c]);
        if ((rc = mkdir_ok(dir)) < 0 || (c == WK_CG_CPUSET && (rc = cpuset_inherit(dir)) < 0))
            goto fail;
        parent_dir(dir, sizeof(dir), c, host);
        if ((rc = mkdir_ok(dir)) < 0 || (c == WK_CG_CPUSET && (rc = cpuset_inherit(dir)) < 0))
            goto fail;
        if (!caps)
            continue;
        if (c == WK_CG_MEMORY) {
            if ((rc = write_u64(dir, "memory.limit_in_bytes", caps->mem_bytes)) < 0)
                goto limits;
            if (cg_tcp && (rc = write_u64(dir, "memory.kmem.tcp.limit_in_bytes", caps->tcp_bytes)) < 0)
                goto limits;
        } else if (c == WK_CG_CPU) {
            cg_quota_cap = caps->vcpu_milli * CPU_PERIOD_US / 1000;
            if ((rc = write_u64(dir, "cpu.cfs_period_us", CPU_PERIOD_US)) < 0 ||
                (rc = write_u64(dir, "cpu.cfs_quota_us",
                                caps->vcpu_milli * CPU_PERIOD_US / 1000)) < 0)
                goto limits;
        }
    }
    return 0;
delegate:
    *why = "Cannot enable the memory, pids and cpu controllers under /sys/fs/cgroup/sandfleet; "
           "run the worker as root in the host cgroup namespace.";
    return rc;
limits:
    *why = "Cannot set the worker's total memory or CPU limit in its parent cgroup; check "
           "/sys/fs/cgroup and host_share_pct.";
    return rc;
fail:
    *why = "Cannot create the sandfleet parent cgroups under /sys/fs/cgroup; run the worker as root.";
    return rc;
}

void wk_cgroup_lookup(wk_cgroup *cg, const char *host, const char *id)
{
    const char *why;
    char parent[256];

    memset(cg, 0, sizeof(*cg));
    cg->fd = -1;
    if (detect(&why) < 0)
        return;
    cg->v2 = cg_mode == 1;
    if (cg->v2) {
        parent_dir(parent, sizeof(parent), 0, host);
        snprintf(cg->dir[0], sizeof(cg->dir[0]), "%s/%s", parent, id);
        snprintf(cg->box, sizeof(cg->box), "%s/%s/box", parent, id);
        snprintf(cg->agent, sizeof(cg->agent), "%s/%s/agent", parent, id);
        return;
    }
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg_have[c])
            continue;
        parent_dir(parent, sizeof(parent), c, host);
        snprintf(cg->dir[c], sizeof(cg->dir[c]), "%s/%s", parent, id);
    }
    snprintf(cg->box, sizeof(cg->box), "%s/box", cg->dir[WK_CG_MEMORY]);
}

uint64_t wk_agent_reserve(uint64_t memory)
{
    uint64_t r = memory / 4;
    return r > WK_AGENT_RESERVE ? WK_AGENT_RESERVE : r;
}

uint64_t wk_tcp_limit(uint64_t memory)
{
    uint64_t t = memory / WK_TCP_SHARE;
    return t < (4ull << 20) ? 4ull << 20 : t;
}

int wk_cgroup_create(wk_cgroup *cg, const char *host, const char *id, const wk_limits *lim,
                     const char **why)
{
    uint64_t mem = (uint64_t)lim->memory_mib << 20, box = mem - wk_agent_reserve(mem);
    uint64_t quota = (uint64_t)lim->vcpu_milli * CPU_PERIOD_US / 1000;
    char cpu[64];
    int rc;

    if ((rc = detect(why)) < 0)
        return rc;
    wk_cgroup_lookup(cg, host, id);
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg->dir[c][0])
            continue;
        if (mkdir(cg->dir[c], 0755) < 0) {
            rc = -errno;
            for (int k = c; k < WK_CG_N; k++)
                cg->dir[k][0] = '\0'; /* not created here: not ours to remove */
            cg->box[0] = cg->agent[0] = '\0';
            *why = rc == -EEXIST ? "A cgroup for this sandbox id already exists; run the worker's "
                                   "start-up cleanup or pick another id."
                                 : "Cannot create the sandbox's cgroup; check /sys/fs/cgroup.";
            goto fail;
        }
    }
    if (cg->v2) {
        snprintf(cpu, sizeof(cpu), "%llu %d", (unsigned long long)quota, CPU_PERIOD_US);
        if ((rc = write_u64(cg->dir[0], "memory.max", mem)) < 0 ||
            (rc = write_u64(cg->dir[0], "pids.max", lim->pids_max)) < 0 ||
            (rc = write_str(cg->dir[0], "cpu.max", cpu)) < 0 ||
            (rc = write_u64(cg->dir[0], "cpu.weight", wk_cpu_weight(lim->vcpu_milli))) < 0 ||
            (rc = write_str(cg->dir[0], "cgroup.subtree_control", "+memory")) < 0)
            goto limits;
        if (mkdir(cg->agent, 0755) < 0 || mkdir(cg->box, 0755) < 0) {
            rc = -errno;
            goto limits;
        }
        if ((rc = write_u64(cg->box, "memory.max", box)) < 0)
            goto limits;
        write_str(cg->box, "memory.swap.max", "0"); /* absent without swap accounting */
        write_str(cg->dir[0], "memory.swap.max", "0");
        if ((cg->fd = open(cg->agent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
            rc = -errno;
            goto limits;
        }
        return 0;
    }
    if (mkdir(cg->box, 0755) < 0) {
        rc = -errno;
        cg->box[0] = '\0';
        goto limits;
    }
    if (cg->dir[WK_CG_CPUSET][0] && (rc = cpuset_inherit(cg->dir[WK_CG_CPUSET])) < 0)
        goto limits;
    if (cg_quota_cap && quota > cg_quota_cap)
        quota = cg_quota_cap; /* v2 clamps by itself; v1 would refuse the write */
    if ((rc = write_u64(cg->dir[WK_CG_MEMORY], "memory.limit_in_bytes", mem)) < 0 ||
        (rc = write_u64(cg->box, "memory.limit_in_bytes", box)) < 0 ||
        (rc = write_u64(cg->dir[WK_CG_PIDS], "pids.max", lim->pids_max)) < 0 ||
        (rc = write_u64(cg->dir[WK_CG_CPU], "cpu.cfs_period_us", CPU_PERIOD_US)) < 0 ||
        (rc = write_u64(cg->dir[WK_CG_CPU], "cpu.cfs_quota_us", quota)) < 0 ||
        (rc = write_u64(cg->dir[WK_CG_CPU], "cpu.shares", wk_cpu_shares(lim->vcpu_milli))) < 0)
        goto limits;
    /* TCP accounting is on only where a TCP limit was written: the box (its sockets'
     * group) and <id>, the same limit (the agent's own socket is a socketpair) */
    if (cg_tcp && ((rc = write_u64(cg->dir[WK_CG_MEMORY], "memory.kmem.tcp.limit_in_bytes",
                                   wk_tcp_limit(mem))) < 0 ||
                   (rc = write_u64(cg->box, "memory.kmem.tcp.limit_in_bytes", wk_tcp_limit(mem))) < 0))
        goto limits;
    /* No swapping past the limits when swap accounting is on. */
    write_u64(cg->dir[WK_CG_MEMORY], "memory.memsw.limit_in_bytes", mem);
    write_u64(cg->box, "memory.memsw.limit_in_bytes", box);
    return 0;
limits:
    *why = "Cannot set the sandbox's memory, CPU or pids limits; check the worker's shape settings.";
fail:
    wk_cgroup_destroy(cg);
    return rc;
}

uint32_t wk_cpu_shares(uint32_t vcpu_milli)
{
    uint64_t s = (uint64_t)vcpu_milli * 1024 / 1000;
    return s < 2 ? 2 : s > 262144 ? 262144 : (uint32_t)s;
}

uint32_t wk_cpu_weight(uint32_t vcpu_milli)
{
    uint32_t w = vcpu_milli / 10;
    return w < 1 ? 1 : w > 10000 ? 10000 : w;
}

int wk_cgroup_open_tasks(const wk_cgroup *cg, int fds[WK_CG_N], int *box_fd)
{
    char path[WK_PATH_MAX];
    int rc;

    for (int c = 0; c < WK_CG_N; c++)
        fds[c] = -1;
    snprintf(path, sizeof(path), "%s/%s", cg->box, cg->v2 ? "cgroup.procs" : "tasks");
    if ((*box_fd = open(path, O_WRONLY | O_CLOEXEC | (cg_fake ? O_CREAT : 0), 0644)) < 0)
        return -errno;
    if (cg->v2)
        return 0;
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg->dir[c][0])
            continue;
        snprintf(path, sizeof(path), "%s/tasks", cg->dir[c]);
        if ((fds[c] = open(path, O_WRONLY | O_CLOEXEC | (cg_fake ? O_CREAT : 0), 0644)) < 0) {
            rc = -errno;
            for (int k = 0; k < WK_CG_N; k++)
                if (fds[k] >= 0)
                    close(fds[k]);
            for (int k = 0; k < WK_CG_N; k++)
                fds[k] = -1;
            close(*box_fd);
            *box_fd = -1;
            return rc;
        }
    }
    return 0;
}

uint64_t wk_cgroup_oom_kills(const wk_cgroup *cg, int *fd)
{
    char buf[1024], path[WK_PATH_MAX], *p;
    ssize_t n;

    if (!cg->box[0])
        return 0;
    if (*fd < 0) {
        int len = snprintf(path, sizeof(path), "%s/%s", cg->box,
                           cg->v2 ? "memory.events" : "memory.oom_control");
        if (len < 0 || (size_t)len >= sizeof(path) ||
            (*fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return 0;
    }
    /* both files are a few short lines: one read from offset 0 has them whole */
    if ((n = pread(*fd, buf, sizeof(buf) - 1, 0)) <= 0)
        return 0;
    buf[n] = '\0';
    if (!(p = strstr(buf, "oom_kill ")))
        return 0;
    return strtoull(p + 9, NULL, 10);
}

/* SIGKILLs every process listed; returns how many were listed. */
static int kill_members(const char *dir)
{
    char buf[65536];
    int n = 0;

    if (read_str(dir, "cgroup.procs", buf, sizeof(buf)) <= 0)
        return 0;
    for (char *p = buf, *nl; *p; p = nl + 1) {
        int64_t pid;
        if (!(nl = strchr(p, '\n')))
            break;
        *nl = '\0';
        if (sf_parse_i64(p, 1, INT32_MAX, &pid) == 0) {
            kill((pid_t)pid, SIGKILL);
            n++;
        }
    }
    return n;
}

/* v1 has no cgroup.kill: the group is frozen first, so that none of the pids read
 * can exit (and be reused by an unrelated process) before its signal, nor fork;
 * the thaw then lets them die. Without a freezer hierarchy this is read-then-kill. */
static void kill_v1(const wk_cgroup *cg, const char *dir)
{
    const char *fz = cg->dir[WK_CG_FREEZER];
    char st[32];

    if (cg_fake)
        return;
    if (!fz[0] || write_str(fz, "freezer.state", "FROZEN") < 0) {
        kill_members(dir);
        return;
    }
    for (int i = 0; i < 500; i++) { /* FREEZING -> FROZEN takes a few ms */
        if (read_str(fz, "freezer.state", st, sizeof(st)) < 0 || !strncmp(st, "FROZEN", 6))
            break;
        nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
    }
    kill_members(fz); /* the freezer group holds every task of the sandbox */
    write_str(fz, "freezer.state", "THAWED");
}

void wk_cgroup_thaw(const wk_cgroup *cg)
{
    const char *fz = cg->v2 ? cg->dir[0] : cg->dir[WK_CG_FREEZER];

    if (fz[0] && !cg_fake)
        write_str(fz, cg->v2 ? "cgroup.freeze" : "freezer.state", cg->v2 ? "0" : "THAWED");
}

/* A fake group is a plain directory: its files go first. */
static void fake_empty(const char *dir)
{
    char p[WK_PATH_MAX];
    struct dirent *e;
    DIR *d;

    if (!cg_fake || !(d = opendir(dir)))
        return;
    while ((e = readdir(d)))
        if (e->d_type == DT_REG && snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) < (int)sizeof(p))
            unlink(p);
    closedir(d);
}

/* Kills what is left in a group and removes it; rmdir retries for up to 2 s while
 * dying tasks leave (they do within milliseconds). */
static int remove_group(const wk_cgroup *cg, const char *dir)
{
    for (int tries = 0;; tries++) {
        if (cg->v2 && !cg_fake)
            write_str(dir, "cgroup.kill", "1");
        else if (!cg->v2)
            kill_v1(cg, dir);
        fake_empty(dir);
        if (rmdir(dir) == 0 || errno == ENOENT)
            return 0;
        if (errno != EBUSY || tries == 1000)
            return -errno;
        nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
    }
}

int wk_cgroup_freeze(const wk_cgroup *cg)
{
    const char *fz = cg->v2 ? cg->dir[0] : cg->dir[WK_CG_FREEZER];

    if (!fz[0])
        return -ENOTSUP;
    return write_str(fz, cg->v2 ? "cgroup.freeze" : "freezer.state", cg->v2 ? "1" : "FROZEN");
}

int wk_cgroup_frozen(const wk_cgroup *cg)
{
    const char *fz = cg->v2 ? cg->dir[0] : cg->dir[WK_CG_FREEZER];
    char st[512];
    int rc;

    if (!fz[0])
        return -ENOTSUP;
    if ((rc = (int)read_str(fz, cg->v2 ? "cgroup.events" : "freezer.state", st, sizeof(st))) < 0)
        return rc;
    if (cg->v2)
        return strstr(st, "frozen 1") != NULL;
    return !strncmp(st, "FROZEN", 6);
}

int wk_cgroup_destroy(wk_cgroup *cg)
{
    int rc = 0, r;

    if (cg->fd >= 0) {
        close(cg->fd);
        cg->fd = -1;
    }
    wk_cgroup_thaw(cg);
    /* children first: box (and v2 agent), then the sandbox's groups; the freezer last,
     * since the v1 kill freezes through it */
    if (cg->box[0] && (r = remove_group(cg, cg->box)) < 0 && rc == 0)
        rc = r;
    if (cg->agent[0] && (r = remove_group(cg, cg->agent)) < 0 && rc == 0)
        rc = r;
    cg->box[0] = cg->agent[0] = '\0';
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg->dir[c][0] || c == WK_CG_FREEZER)
            continue;
        if ((r = remove_group(cg, cg->dir[c])) < 0 && rc == 0)
            rc = r;
        cg->dir[c][0] = '\0';
    }
    if (cg->dir[WK_CG_FREEZER][0]) {
        if ((r = remove_group(cg, cg->dir[WK_CG_FREEZER])) < 0 && rc == 0)
            rc = r;
        cg->dir[WK_CG_FREEZER][0] = '\0';
    }
    return rc;
}
