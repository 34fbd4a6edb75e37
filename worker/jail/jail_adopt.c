/* A jail outlives its worker: what a restarted worker needs to take it back.
 *
 * Each sandbox has a host-only folder state_dir/adopt/<id>/ (root, 0700; so is
 * state_dir/adopt): `agent.sock`, the unix socket the agent listens on (the jail gets it
 * as fd 5, SF_AP_LISTEN_FD, and accepts the next worker there), and `handle`, one line
 * written atomically once the jail runs:
 *     v1 <init pid> <init start time (clock ticks, /proc/PID/stat field 22)> <host uid>
 *        <memory_mib> <vcpu_milli> <disk_mib> <pids_max> <inodes>
 * A restarted worker believes a handle only if the folder and the file are root's and
 * not writable by others (no link followed on the way), and the pid still names that
 * same process: its start time matches (a reused pid does not), it is alive (not a
 * zombie), and its cgroup is sandfleet/<host>/<id> (so only this sandbox's init fits).
 * A tenant can write none of it: the jail sees no host path. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_util.h"
#include "sf_msg.h"

#define HANDLE_MAX 256

/* The socket's address through the checked folder's fd (no path walked again). */
static int sock_addr(int dfd, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    return snprintf(a->sun_path, sizeof(a->sun_path), "/proc/self/fd/%d/agent.sock", dfd) <
                   (int)sizeof(a->sun_path)
               ? 0
               : -ENAMETOOLONG;
}

int wk_adopt_listen(const char *state_dir, const char *id, const char **why)
{
    struct sockaddr_un a;
    int dfd = wk_adopt_dir(state_dir, id, 1), fd = -1, rc;

    if (dfd < 0) {
        *why = "Cannot make the sandbox's folder under state_dir/adopt (it must be root's, "
               "mode 0700); check state_dir.";
        return dfd;
    }
    unlinkat(dfd, "agent.sock", 0);
    unlinkat(dfd, "handle", 0);
    if ((rc = sock_addr(dfd, &a)) < 0 ||
        (fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 4) < 0) {
        rc = rc < 0 ? rc : -errno;
        if (fd >= 0)
            close(fd);
        close(dfd);
        *why = "Cannot make the sandbox agent's socket under state_dir/adopt; check state_dir.";
        return rc;
    }
    close(dfd);
    return fd;
}

int wk_adopt_write(const char *state_dir, const char *id, pid_t pid, uint32_t host_uid,
                   const wk_limits *lim)
{
    unsigned long long start;
    char line[HANDLE_MAX], state;
    int dfd, fd, n, rc = 0;

    if (wk_proc_stat(pid, &start, &state) < 0)
        return -ESRCH;
    n = snprintf(line, sizeof(line), "v1 %d %llu %u %u %u %u %u %llu\n", (int)pid, start,
                 host_uid, lim->memory_mib, lim->vcpu_milli, lim->disk_mib, lim->pids_max,
                 (unsigned long long)lim->inodes);
    if ((dfd = wk_adopt_dir(state_dir, id, 0)) < 0)
        return dfd;
    fd = openat(dfd, "handle.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    /* (no fsync: the rename is atomic for a worker that dies; after a power loss no jail
     * is left to take back) */
    if (fd < 0 || write(fd, line, (size_t)n) != n ||
        renameat(dfd, "handle.tmp", dfd, "handle") < 0)
        rc = -errno ? -errno : -EIO;
    if (fd >= 0)
        close(fd);
    close(dfd);
    return rc;
}

void wk_adopt_remove(const char *state_dir, const char *id)
{
    int root = wk_adopt_root(state_dir, 0);

    if (root < 0 || !sf_id_valid(id)) {
        if (root >= 0)
            close(root);
        return;
    }
    {
        int dfd = openat(root, id, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd >= 0) {
            unlinkat(dfd, "agent.sock", 0);
            unlinkat(dfd, "handle", 0);
            unlinkat(dfd, "handle.tmp", 0);
            close(dfd);
        }
    }
    unlinkat(root, id, AT_REMOVEDIR);
    close(root);
}

int wk_adopt_check(const char *state_dir, const char *host, const char *id, wk_adopt_handle *h,
                   const char **why)
{
    char buf[HANDLE_MAX], state;
    unsigned long long start, now_start, inodes;
    unsigned mem, vcpu, disk, pids, uid;
    struct stat st;
    ssize_t n;
    int dfd, fd, pid, pidfd;

    *why = SF_MSG_ADOPT_NO_HANDLE;
    if ((dfd = wk_adopt_dir(state_dir, id, 0)) < 0)
        return -ENOENT;
    fd = openat(dfd, "handle", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    close(dfd);
    if (fd < 0)
        return -ENOENT;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 077) ||
        st.st_size >= HANDLE_MAX || (n = read(fd, buf, sizeof(buf) - 1)) <= 0) {
        close(fd);
        *why = SF_MSG_ADOPT_BAD_HANDLE;
        return -EINVAL;
    }
    close(fd);
    buf[n] = '\0';
    if (sscanf(buf, "v1 %d %llu %u %u %u %u %u %llu", &pid, &start, &uid, &mem, &vcpu, &disk,
               &pids, &inodes) != 8 || pid <= 1) {
        *why = "Its host-side handle is damaged.";
        return -EINVAL;
    }
    *why = "Its processes died while no worker ran (the init is gone).";
    if (wk_proc_stat(pid, &now_start, &state) < 0 || now_start != start || state == 'Z' ||
        state == 'X')
        return -ESRCH;
    if (!wk_proc_in_cgroup(pid, host, id)) {
        *why = "The process its handle names is not this sandbox's init.";
        return -ESRCH;
    }
    if ((pidfd = (int)syscall(SYS_pidfd_open, pid, 0)) < 0)
        return -ESRCH;
    /* The pidfd names the process that had the pid when it was opened: the same one if
     * the start time still matches now. */
    if (wk_proc_stat(pid, &now_start, &state) < 0 || now_start != start || state == 'Z') {
        close(pidfd);
        return -ESRCH;
    }
    fcntl(pidfd, F_SETFD, FD_CLOEXEC);
    h->pid = pid;
    h->pidfd = pidfd;
    h->host_uid = uid;
    h->lim = (wk_limits){.memory_mib = mem, .vcpu_milli = vcpu, .disk_mib = disk,
                         .pids_max = pids, .inodes = inodes};
    return 0;
}

int wk_adopt_connect(const char *state_dir, const char *id)
{
    struct sockaddr_un a;
    int dfd = wk_adopt_dir(state_dir, id, 0), fd, rc;

    if (dfd < 0)
        return dfd;
    if ((rc = sock_addr(dfd, &a)) < 0 || (fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
        close(dfd);
        return rc < 0 ? rc : -errno;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        rc = -errno;
        close(fd);
        close(dfd);
        return rc;
    }
    close(dfd);
    return fd;
}

int wk_slot_take(uint32_t host_uid, int *lock_fd)
{
    char path[128];
    int fd;

    snprintf(path, sizeof(path), WK_UID_LOCK_DIR "/%u.lock", host_uid);
    if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        close(fd);
        return -EBUSY;
    }
    *lock_fd = fd;
    return 0;
}

int wk_slot_is(int fd, uint32_t host_uid)
{
    char path[128];
    struct stat a, b;

    snprintf(path, sizeof(path), WK_UID_LOCK_DIR "/%u.lock", host_uid);
    return fstat(fd, &a) == 0 && lstat(path, &b) == 0 && S_ISREG(a.st_mode) &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int wk_disk_remount(const char *sbdir)
{
    char img[WK_PATH_MAX], mnt[WK_PATH_MAX], dev[300];
    struct stat st, ms, ps;
    DIR *d;
    struct dirent *e;
    int rc = -ENOENT;

    if (snprintf(img, sizeof(img), "%s/" WK_DISK_IMAGE, sbdir) >= (int)sizeof(img) ||
        snprintf(mnt, sizeof(mnt), "%s/" WK_DISK_MOUNT, sbdir) >= (int)sizeof(mnt))
        return -ENAMETOOLONG;
    if (lstat(img, &st) < 0 || !S_ISREG(st.st_mode) || lstat(mnt, &ms) < 0 ||
        !S_ISDIR(ms.st_mode) || lstat(sbdir, &ps) < 0)
        return -ENOENT;
    if (ms.st_dev != ps.st_dev)
        return 0; /* mounted here already */
    if (!(d = opendir("/sys/block")))
        return -errno;
    while ((e = readdir(d)) && rc == -ENOENT) {
        struct loop_info64 li;
        int fd;

        if (strncmp(e->d_name, "loop", 4) || strlen(e->d_name) > 16)
            continue;
        snprintf(dev, sizeof(dev), "/dev/%s", e->d_name);
        if ((fd = open(dev, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        if (ioctl(fd, LOOP_GET_STATUS64, &li) == 0 && li.lo_inode == st.st_ino &&
            li.lo_device == st.st_dev)
            rc = mount(dev, mnt, "ext4", MS_NODEV | MS_NOSUID | MS_NOATIME, NULL) == 0 ? 0
                                                                                     : -errno;
        close(fd);
    }
    closedir(d);
    return rc;
}
