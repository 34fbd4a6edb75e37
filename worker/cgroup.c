/* cgroups for jail sandboxes: one group per sandbox under a `sandfleet` parent.
 *   v2 (when /sys/fs/cgroup is cgroup2 and lists memory and pids):
 *      /sys/fs/cgroup/sandfleet/<id>: memory.max, memory.swap.max=0, pids.max,
 *      cgroup.freeze for pause; the init is born inside (CLONE_INTO_CGROUP).
 *   v1 (hybrid or legacy): /sys/fs/cgroup/{memory,pids,freezer}/sandfleet/<id>:
 *      memory.limit_in_bytes (+ memsw when swap accounting is on), pids.max,
 *      freezer.state; the jail's first process moves itself into each group
 *      (through `tasks` files the worker opened) before it does anything else. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_util.h"

#define CG_ROOT "/sys/fs/cgroup"
#define CG_PARENT "sandfleet"

static int cg_mode = -1; /* -1 unknown, 0 v1, 1 v2 */
static int cg_freezer;   /* v1 freezer hierarchy present */

static const char *const v1_ctrl[WK_CG_N] = {"memory", "pids", "freezer"};

static int write_str(const char *dir, const char *file, const char *s)
{
    char path[WK_PATH_MAX];
    size_t len = strlen(s);
    int fd, n = snprintf(path, sizeof(path), "%s/%s", dir, file);
    ssize_t w;

    if (n < 0 || (size_t)n >= sizeof(path))
        return -ENAMETOOLONG;
    if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
        return -errno;
    w = write(fd, s, len);
    n = w == (ssize_t)len ? 0 : w < 0 ? -errno : -EIO;
    close(fd);
    return n;
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

static int detect(const char **why)
{
    char ctrl[512];

    if (cg_mode >= 0)
        return 0;
    if (is_fs(CG_ROOT, CGROUP2_SUPER_MAGIC) &&
        read_str(CG_ROOT, "cgroup.controllers", ctrl, sizeof(ctrl)) >= 0 &&
        has_word(ctrl, "memory") && has_word(ctrl, "pids")) {
        cg_mode = 1;
        return 0;
    }
    if (is_fs(CG_ROOT "/memory", CGROUP_SUPER_MAGIC) && is_fs(CG_ROOT "/pids", CGROUP_SUPER_MAGIC)) {
        cg_mode = 0;
        cg_freezer = is_fs(CG_ROOT "/freezer", CGROUP_SUPER_MAGIC);
        return 0;
    }
    *why = "No usable cgroups: need cgroup v2 with the memory and pids controllers at "
           "/sys/fs/cgroup, or cgroup v1 memory and pids hierarchies under /sys/fs/cgroup.";
    return -ENOTSUP;
}

int wk_cgroup_is_v2(void)
{
    return cg_mode == 1;
}

int wk_cgroup_host_init(const char **why)
{
    int rc;

    if ((rc = detect(why)) < 0)
        return rc;
    if (cg_mode == 1) {
        if (mkdir(CG_ROOT "/" CG_PARENT, 0755) < 0 && errno != EEXIST)
            goto fail;
        /* The root already delegates when the controllers are listed there. */
        write_str(CG_ROOT, "cgroup.subtree_control", "+memory +pids");
        if ((rc = write_str(CG_ROOT "/" CG_PARENT, "cgroup.subtree_control", "+memory +pids")) < 0) {
            *why = "Cannot enable the memory and pids controllers under /sys/fs/cgroup/sandfleet; "
                   "run the worker as root in the host cgroup namespace.";
            return rc;
        }
        return 0;
    }
    for (int c = 0; c < WK_CG_N; c++) {
        char dir[256];
        if (c == WK_CG_FREEZER && !cg_freezer)
            continue;
        snprintf(dir, sizeof(dir), CG_ROOT "/%s/" CG_PARENT, v1_ctrl[c]);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            goto fail;
    }
    return 0;
fail:
    rc = -errno;
    *why = "Cannot create the sandfleet parent cgroups under /sys/fs/cgroup; run the worker as root.";
    return rc;
}

void wk_cgroup_lookup(wk_cgroup *cg, const char *id)
{
    const char *why;

    memset(cg, 0, sizeof(*cg));
    cg->fd = -1;
    if (detect(&why) < 0)
        return;
    cg->v2 = cg_mode == 1;
    if (cg->v2) {
        snprintf(cg->dir[0], sizeof(cg->dir[0]), CG_ROOT "/" CG_PARENT "/%s", id);
        return;
    }
    for (int c = 0; c < WK_CG_N; c++)
        if (c != WK_CG_FREEZER || cg_freezer)
            snprintf(cg->dir[c], sizeof(cg->dir[c]), CG_ROOT "/%s/" CG_PARENT "/%s", v1_ctrl[c], id);
}

int wk_cgroup_create(wk_cgroup *cg, const char *id, uint64_t memory, int pids, const char **why)
{
    char mem[32], pid[32];
    int rc;

    if ((rc = wk_cgroup_host_init(why)) < 0)
        return rc;
    wk_cgroup_lookup(cg, id);
    snprintf(mem, sizeof(mem), "%llu", (unsigned long long)memory);
    snprintf(pid, sizeof(pid), "%d", pids);
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg->dir[c][0])
            continue;
        if (mkdir(cg->dir[c], 0755) < 0) {
            rc = -errno;
            for (int k = c; k < WK_CG_N; k++)
                cg->dir[k][0] = '\0'; /* not created here: not ours to remove */
            *why = rc == -EEXIST ? "A cgroup for this sandbox id already exists; run the worker's "
                                   "start-up cleanup or pick another id."
                                 : "Cannot create the sandbox's cgroup; check /sys/fs/cgroup.";
            goto fail;
        }
    }
    if (cg->v2) {
        if ((rc = write_str(cg->dir[0], "memory.max", mem)) < 0 ||
            (rc = write_str(cg->dir[0], "pids.max", pid)) < 0)
            goto limits;
        write_str(cg->dir[0], "memory.swap.max", "0"); /* absent without swap accounting */
        if ((cg->fd = open(cg->dir[0], O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
            rc = -errno;
            goto limits;
        }
        return 0;
    }
    if ((rc = write_str(cg->dir[WK_CG_MEMORY], "memory.limit_in_bytes", mem)) < 0 ||
        (rc = write_str(cg->dir[WK_CG_PIDS], "pids.max", pid)) < 0)
        goto limits;
    /* No swapping past the limit when swap accounting is on. */
    write_str(cg->dir[WK_CG_MEMORY], "memory.memsw.limit_in_bytes", mem);
    return 0;
limits:
    *why = "Cannot set the sandbox's memory or pids limit; check the worker's memory_mib and pids_max.";
fail:
    wk_cgroup_destroy(cg);
    return rc;
}

int wk_cgroup_open_tasks(const wk_cgroup *cg, int fds[WK_CG_N])
{
    char path[WK_PATH_MAX];
    int rc;

    for (int c = 0; c < WK_CG_N; c++)
        fds[c] = -1;
    if (cg->v2)
        return 0;
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg->dir[c][0])
            continue;
        snprintf(path, sizeof(path), "%s/tasks", cg->dir[c]);
        if ((fds[c] = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
            rc = -errno;
            for (int k = 0; k < c; k++)
                if (fds[k] >= 0)
                    close(fds[k]);
            for (int k = 0; k < WK_CG_N; k++)
                fds[k] = -1;
            return rc;
        }
    }
    return 0;
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
static void kill_v1(const wk_cgroup *cg, int c)
{
    const char *fz = cg->dir[WK_CG_FREEZER];
    char st[32];

    if (!fz[0] || write_str(fz, "freezer.state", "FROZEN") < 0) {
        kill_members(cg->dir[c]);
        return;
    }
    for (int i = 0; i < 500; i++) { /* FREEZING -> FROZEN takes a few ms */
        if (read_str(fz, "freezer.state", st, sizeof(st)) < 0 || !strncmp(st, "FROZEN", 6))
            break;
        nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
    }
    kill_members(fz); /* the freezer group holds the same tasks */
    write_str(fz, "freezer.state", "THAWED");
}

void wk_cgroup_thaw(const wk_cgroup *cg)
{
    const char *fz = cg->v2 ? cg->dir[0] : cg->dir[WK_CG_FREEZER];

    if (fz[0])
        write_str(fz, cg->v2 ? "cgroup.freeze" : "freezer.state", cg->v2 ? "0" : "THAWED");
}

int wk_cgroup_destroy(wk_cgroup *cg)
{
    int rc = 0;

    if (cg->fd >= 0) {
        close(cg->fd);
        cg->fd = -1;
    }
    wk_cgroup_thaw(cg);
    for (int c = 0; c < WK_CG_N; c++) {
        if (!cg->dir[c][0])
            continue;
        /* Normally empty already (the pid namespace ended with its init). What
         * is left (a crashed worker's sandbox) is killed; dying tasks leave the
         * group within milliseconds, so rmdir retries for up to 2 s. */
        for (int tries = 0;; tries++) {
            if (cg->v2)
                write_str(cg->dir[c], "cgroup.kill", "1");
            else
                kill_v1(cg, c);
            if (rmdir(cg->dir[c]) == 0 || errno == ENOENT)
                break;
            if (errno != EBUSY || tries == 1000) {
                if (rc == 0)
                    rc = -errno;
                break;
            }
            nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
        }
        cg->dir[c][0] = '\0';
    }
    return rc;
}
