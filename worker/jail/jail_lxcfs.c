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
        /* It goes with the worker (the mount namespace it serves goes too). */
        prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
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
            if (waitpid(lx->pid, &status, WNOHANG) == lx->pid) {
                lx->pid = -1;
                break;
            }
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        }
        if (lx->pid > 0) {
            kill(lx->pid, SIGKILL);
            waitpid(lx->pid, &status, 0);
            lx->pid = -1;
        }
    }
}
