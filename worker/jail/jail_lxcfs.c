/* The sandboxes' own view of themselves: Debian's lxcfs (a FUSE file system) serves
 * /proc/meminfo, cpuinfo, stat, loadavg, uptime, diskstats and swaps computed from the
 * cgroups of the reading process's pid-namespace init (the sandbox's agent, whose
 * groups carry the sandbox's memory and CPU limits). The worker runs one lxcfs of its
 * own, mounted at state_dir/lxcfs in its private mount namespace; each jail binds
 * those files over its /proc (jail_spawn.c). Without lxcfs the worker still runs (the
 * sandboxes then see the host's figures) and says so once. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_log.h"
#include "sf_util.h"
#include "sf_msg.h"

#define LXCFS_BIN "/usr/bin/lxcfs"
#define FUSE_MAGIC 0x65735546
#define START_WAIT_MS 5000

const char *const wk_lxcfs_files[WK_LXCFS_FILES] = {
    "meminfo", "cpuinfo", "stat", "loadavg", "uptime", "diskstats", "swaps",
};

static int mounted(const char *dir)
{
    struct statfs sf;
    char p[WK_PATH_MAX];

    if (statfs(dir, &sf) < 0 || (long)sf.f_type != FUSE_MAGIC)
        return 0;
    snprintf(p, sizeof(p), "%s/proc/meminfo", dir);
    return access(p, R_OK) == 0;
}

int wk_lxcfs_start(const char *state_dir, wk_lxcfs *lx, const char **why)
{
    char pidfile[WK_PATH_MAX];
    int64_t deadline;
    pid_t pid;

    lx->pid = -1;
    lx->dir[0] = '\0';
    if (access(LXCFS_BIN, X_OK) < 0) {
        *why = "lxcfs is not installed (apt-get install lxcfs): sandboxes see the host's "
               "/proc/meminfo, cpuinfo, stat, loadavg and uptime.";
        return -ENOENT;
    }
    if (snprintf(lx->dir, sizeof(lx->dir), "%s/lxcfs", state_dir) >= (int)sizeof(lx->dir) ||
        snprintf(pidfile, sizeof(pidfile), "%s/lxcfs.pid", state_dir) >= (int)sizeof(pidfile)) {
        *why = SF_MSG_STATE_DIR_LONG;
        return -ENAMETOOLONG;
    }
    umount2(lx->dir, MNT_DETACH); /* a stale one (its lxcfs died) */
    if (mkdir(lx->dir, 0755) < 0 && errno != EEXIST) {
        *why = "Cannot create state_dir/lxcfs; check that state_dir is writable by root.";
        return -errno;
    }
    unlink(pidfile);
    if ((pid = fork()) < 0) {
        *why = "Cannot start lxcfs: out of processes.";
        return -errno;
    }
    if (pid == 0) {
        char *argv[] = {"lxcfs", "-f", "-l", "--enable-cfs", "--enable-pidfd", "-p", pidfile,
                        lx->dir, NULL};
        /* It outlives a worker that dies (the jails it kept bind its files; the next
         * worker joins its mount namespace, wk_lxcfs_find); a clean stop ends it. Its own
         * session: a signal to the worker's process group is not for it. */
        setsid();
        syscall(SYS_close_range, 3, ~0U, 0);
        execv(LXCFS_BIN, argv);
        _exit(127);
    }
    lx->pid = pid;
    deadline = sf_mono_ms() + START_WAIT_MS;
    while (!mounted(lx->dir)) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            lx->pid = -1;
            *why = "lxcfs exited at start (see the worker's log): sandboxes see the host's "
                   "/proc figures.";
            return -EIO;
        }
        if (sf_mono_ms() > deadline) {
            wk_lxcfs_stop(lx);
            *why = "lxcfs did not mount within 5 s: sandboxes see the host's /proc figures.";
            return -ETIMEDOUT;
        }
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    return 0;
}

/* Reads a small /proc file of pid (NUL bytes as spaces): length, or -1. */
static ssize_t proc_read(pid_t pid, const char *what, char *buf, size_t n)
{
    char path[64];
    ssize_t got;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    got = read(fd, buf, n - 1);
    close(fd);
    if (got < 0)
        return -1;
    for (ssize_t i = 0; i < got; i++)
        if (!buf[i])
            buf[i] = ' ';
    buf[got] = '\0';
    return got;
}

pid_t wk_lxcfs_find(const char *state_dir)
{
    char pidfile[WK_PATH_MAX], dir[WK_PATH_MAX], buf[4096], want[WK_PATH_MAX + 2];
    long pid = 0;
    ssize_t n;
    int fd;

    if (snprintf(pidfile, sizeof(pidfile), "%s/lxcfs.pid", state_dir) >= (int)sizeof(pidfile) ||
        snprintf(dir, sizeof(dir), "%s/lxcfs", state_dir) >= (int)sizeof(dir))
        return -1;
    if ((fd = open(pidfile, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        return -1;
    n = read(fd, buf, 31);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    pid = strtol(buf, NULL, 10);
    if (pid <= 1 || pid > 1 << 22)
        return -1;
    /* the same program, serving this state_dir's mount point (a reused pid is neither) */
    snprintf(want, sizeof(want), " %s ", dir);
    if (proc_read((pid_t)pid, "comm", buf, sizeof(buf)) <= 0 || strcmp(buf, "lxcfs\n") ||
        proc_read((pid_t)pid, "cmdline", buf, sizeof(buf)) <= 0)
        return -1;
    n = (ssize_t)strlen(buf);
    if (n + 1 < (ssize_t)sizeof(buf)) { /* (the last argument ends with a NUL: a space now) */
        buf[n] = ' ';
        buf[n + 1] = '\0';
    }
    return strstr(buf, want) ? (pid_t)pid : -1;
}

int wk_lxcfs_adopt(const char *state_dir, pid_t pid, wk_lxcfs *lx)
{
    if (snprintf(lx->dir, sizeof(lx->dir), "%s/lxcfs", state_dir) >= (int)sizeof(lx->dir))
        return -ENAMETOOLONG;
    lx->pid = pid;
    lx->adopted = 1;
    return mounted(lx->dir) ? 0 : -ENOENT;
}

int wk_lxcfs_alive(const wk_lxcfs *lx)
{
    return lx->pid > 0 && mounted(lx->dir);
}

void wk_lxcfs_stop(wk_lxcfs *lx)
{
    int status;

    /* unmounted first: a FUSE daemon notices SIGTERM only when its next request comes, so
     * it would sit out the whole wait; the unmount ends its loop at once */
    if (lx->dir[0])
        umount2(lx->dir, MNT_DETACH);
    if (lx->pid > 0) {
        kill(lx->pid, SIGTERM);
        for (int i = 0; i < 200; i++) {
            /* (one a worker before us started is not our child: gone when kill says so) */
            if ((!lx->adopted && waitpid(lx->pid, &status, WNOHANG) == lx->pid) ||
                (lx->adopted && kill(lx->pid, 0) < 0)) {
                lx->pid = -1;
                break;
            }
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        }
        if (lx->pid > 0) {
            kill(lx->pid, SIGKILL);
            if (!lx->adopted)
                waitpid(lx->pid, &status, 0);
            lx->pid = -1;
        }
    }
}
