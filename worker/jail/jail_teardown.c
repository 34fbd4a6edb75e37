/* A jail sandbox's teardown, once its pid namespace has ended: its cgroups, its disk
 * (an unmount and one file), its directory (mount points only). It runs in a child
 * process of the worker (`sf-teardown`), so the worker's loop never waits for it and a
 * test can stop it (SIGSTOP) half-way: the child makes only plain system calls (the
 * worker has threads; nothing that allocates or takes a lock).
 *
 * Steps, in order; the child's exit status is the first step that failed (0: all):
 *   1 cgroups   whatever is left is killed (frozen first on v1, so no pid is reused
 *               between reading and killing), the groups removed
 *   2 unmount   the sandbox's ext4 (detached: it is released, and its loop device
 *               with it, when the last user lets go)
 *   3 files     disk.img, then the mount points and the directory
 * With teardown_stop (tests) the child stops itself between steps 1 and 2. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail_int.h"

int wk_teardown_run(wk_cgroup *cg, const char *sbdir, int stop_halfway)
{
    char p[WK_PATH_MAX];
    int n, rc = 0;

    if (wk_cgroup_destroy(cg) < 0)
        rc = rc ? rc : 1;
    if (stop_halfway)
        raise(SIGSTOP);
    n = snprintf(p, sizeof(p), "%s/" WK_DISK_MOUNT, sbdir);
    if (n > 0 && (size_t)n < sizeof(p) && umount2(p, MNT_DETACH) < 0 && errno != EINVAL &&
        errno != ENOENT)
        rc = rc ? rc : 2;
    n = snprintf(p, sizeof(p), "%s/" WK_DISK_IMAGE, sbdir);
    if (n > 0 && (size_t)n < sizeof(p) && unlink(p) < 0 && errno != ENOENT)
        rc = rc ? rc : 3;
    n = snprintf(p, sizeof(p), "%s/" WK_DISK_MOUNT, sbdir);
    if (n > 0 && (size_t)n < sizeof(p) && rmdir(p) < 0 && errno != ENOENT)
        rc = rc ? rc : 3;
    n = snprintf(p, sizeof(p), "%s/rootfs", sbdir);
    if (n > 0 && (size_t)n < sizeof(p) && rmdir(p) < 0 && errno != ENOENT)
        rc = rc ? rc : 3;
    if (rmdir(sbdir) < 0 && errno != ENOENT)
        rc = rc ? rc : 3;
    return rc;
}

int wk_teardown_spawn(wk_cgroup *cg, const char *sbdir, int stop_halfway, int *pidfd_out)
{
    pid_t pid = fork();
    int pidfd;

    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_NAME, "sf-teardown", 0, 0, 0);
        /* The worker's death must not leave a stopped child behind. */
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        _exit(wk_teardown_run(cg, sbdir, stop_halfway));
    }
    if ((pidfd = (int)syscall(SYS_pidfd_open, pid, 0)) < 0) {
        int rc = -errno, status;
        kill(pid, SIGCONT);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        return rc;
    }
    *pidfd_out = pidfd;
    return 0;
}
