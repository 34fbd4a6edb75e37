/* Each jail sandbox's writable layer on a filesystem of its own: a sparse ext4 image
 * file of exactly its disk quota (bytes and inodes), attached to a loop device and
 * mounted at state_dir/sandboxes/<id>/fs in the worker's private mount namespace.
 * Writing past the quota fails with ENOSPC inside the sandbox; the image never
 * allocates more than its size; teardown is an unmount and the removal of one file,
 * never a walk of the tenant's tree.
 *
 * Images of the default shape are formatted ahead of time (state_dir/images/), so a
 * create only renames one into place; other shapes are formatted on demand (tens of
 * ms, on the create's pool thread). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_log.h"
#include "sf_util.h"
#include "sf_msg.h"

#define IMAGES_SUB "/images"
#define LOOP_TRIES 16

extern char **environ;

static const char *const mkfs_paths[] = {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"};
static const char *mkfs_path;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned pool_seq;

static int images_dir(const char *state_dir, char *buf, size_t n)
{
    int r = snprintf(buf, n, "%s" IMAGES_SUB, state_dir);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

int wk_disk_host_init(const char *state_dir, const char **why)
{
    char dir[WK_PATH_MAX], path[WK_PATH_MAX];
    struct dirent *e;
    DIR *d;
    int fd;

    for (size_t i = 0; i < sizeof(mkfs_paths) / sizeof(mkfs_paths[0]) && !mkfs_path; i++)
        if (access(mkfs_paths[i], X_OK) == 0)
            mkfs_path = mkfs_paths[i];
    if (!mkfs_path) {
        *why = "The jail driver formats each sandbox's disk with mkfs.ext4; install e2fsprogs.";
        return -ENOENT;
    }
    if ((fd = open("/dev/loop-control", O_RDWR | O_CLOEXEC)) < 0) {
        int rc = -errno;
        *why = "The jail driver needs loop devices (/dev/loop-control) for the sandboxes' disks; "
               "load the loop module (modprobe loop) and run the worker as root.";
        return rc;
    }
    close(fd);
    if (images_dir(state_dir, dir, sizeof(dir)) < 0 || wk_mkdir_p(dir, 0700) < 0) {
        *why = "Cannot create state_dir/images; check that state_dir is writable by root.";
        return -EIO;
    }
    /* Images of an earlier run may be half written: start over. */
    if ((d = opendir(dir))) {
        while ((e = readdir(d))) {
            int n;
            if (e->d_name[0] == '.')
                continue;
            n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (n > 0 && (size_t)n < sizeof(path))
                unlink(path);
        }
        closedir(d);
    }
    return 0;
}

/* Formats path as a sparse ext4 image of disk_mib and inodes, root directory owned
 * by host root. Blocking (mkfs.ext4 runs as a child). */
static int format(const char *path, uint32_t disk_mib, uint64_t inodes)
{
    char size[32], ninodes[32];
    char *argv[] = {(char *)mkfs_path, "-q", "-F", "-b", "4096", "-m", "0", "-N", ninodes,
                    "-O", "^has_journal,^resize_inode",
                    "-E", "lazy_itable_init=1,nodiscard", (char *)path, size, NULL};
    posix_spawn_file_actions_t fa;
    int fd, status, rc;
    pid_t pid;

    snprintf(size, sizeof(size), "%uM", disk_mib);
    snprintf(ninodes, sizeof(ninodes), "%llu", (unsigned long long)inodes);
    if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
        return -errno;
    rc = ftruncate(fd, (off_t)disk_mib << 20) < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return rc;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    rc = -posix_spawn(&pid, mkfs_path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc < 0)
        return rc;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

static int pool_name(char *buf, size_t n, const char *dir, uint32_t disk_mib, uint64_t inodes,
                     const char *tail)
{
    int r = snprintf(buf, n, "%s/d%u-i%llu%s", dir, disk_mib, (unsigned long long)inodes, tail);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

/* Moves a ready image of this shape to dst: 0, or -ENOENT when the pool has none. */
static int pool_take(const char *state_dir, uint32_t disk_mib, uint64_t inodes, const char *dst)
{
    char dir[WK_PATH_MAX], prefix[128], path[WK_PATH_MAX];
    struct dirent *e;
    int rc = -ENOENT;
    size_t plen;
    DIR *d;

    if (images_dir(state_dir, dir, sizeof(dir)) < 0)
        return -ENAMETOOLONG;
    snprintf(prefix, sizeof(prefix), "d%u-i%llu.ready-", disk_mib, (unsigned long long)inodes);
    plen = strlen(prefix);
    pthread_mutex_lock(&pool_mu);
    if ((d = opendir(dir))) {
        while (rc == -ENOENT && (e = readdir(d))) {
            int n;
            if (strncmp(e->d_name, prefix, plen) != 0)
                continue;
            n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (n > 0 && (size_t)n < sizeof(path) && rename(path, dst) == 0)
                rc = 0;
        }
        closedir(d);
    }
    pthread_mutex_unlock(&pool_mu);
    return rc;
}

int wk_disk_pool_fill(const char *state_dir, uint32_t disk_mib, uint64_t inodes, unsigned want)
{
    char dir[WK_PATH_MAX], prefix[128], tmp[WK_PATH_MAX], ready[WK_PATH_MAX], tail[48];
    unsigned have = 0, seq;
    struct dirent *e;
    DIR *d;
    int rc = 0;

    if (!mkfs_path || images_dir(state_dir, dir, sizeof(dir)) < 0)
        return -EINVAL;
    snprintf(prefix, sizeof(prefix), "d%u-i%llu.ready-", disk_mib, (unsigned long long)inodes);
    for (;;) {
        have = 0;
        pthread_mutex_lock(&pool_mu);
        if ((d = opendir(dir))) {
            while ((e = readdir(d)))
                have += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
            closedir(d);
        }
        seq = ++pool_seq;
        pthread_mutex_unlock(&pool_mu);
        if (have >= want)
            return 0;
        snprintf(tail, sizeof(tail), ".tmp-%d-%u", (int)getpid(), seq);
        if (pool_name(tmp, sizeof(tmp), dir, disk_mib, inodes, tail) < 0)
            return -ENAMETOOLONG;
        snprintf(tail, sizeof(tail), ".ready-%d-%u", (int)getpid(), seq);
        if (pool_name(ready, sizeof(ready), dir, disk_mib, inodes, tail) < 0)
            return -ENAMETOOLONG;
        if ((rc = format(tmp, disk_mib, inodes)) < 0 || rename(tmp, ready) < 0) {
            rc = rc < 0 ? rc : -errno;
            unlink(tmp);
            return rc;
        }
    }
}

/* Attaches the image open at img_fd to a free loop device (auto-cleared: it detaches
 * when the filesystem on it is unmounted). Returns the loop device's fd. */
static int loop_attach(int img_fd, char *dev, size_t devlen)
{
    struct loop_config cfg;
    int ctl, rc = -EBUSY;

    if ((ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC)) < 0)
        return -errno;
    for (int tries = 0; tries < LOOP_TRIES && rc == -EBUSY; tries++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE), fd;
        if (n < 0) {
            rc = -errno;
            break;
        }
        snprintf(dev, devlen, "/dev/loop%d", n);
        if ((fd = open(dev, O_RDWR | O_CLOEXEC)) < 0) {
            rc = -errno;
            break;
        }
        memset(&cfg, 0, sizeof(cfg));
        cfg.fd = (uint32_t)img_fd;
        cfg.block_size = 4096;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
            close(ctl);
            return fd;
        }
        rc = -errno;
        if (rc == -EINVAL) {
            /* no direct I/O on this backing file system: cached I/O then */
            cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
            cfg.block_size = 0;
            if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
                close(ctl);
                return fd;
            }
            rc = -errno;
        }
        close(fd); /* -EBUSY: another process took this one first; ask again */
    }
    close(ctl);
    return rc;
}

int wk_disk_attach(const char *state_dir, const char *sbdir, uint32_t disk_mib, uint64_t inodes,
                   uint32_t host_uid, const char **why)
{
    char img[WK_PATH_MAX], mnt[WK_PATH_MAX], dev[64];
    int img_fd = -1, loop_fd = -1, fsfd = -1, rc, n;

    n = snprintf(img, sizeof(img), "%s/" WK_DISK_IMAGE, sbdir);
    if (n < 0 || (size_t)n >= sizeof(img) ||
        snprintf(mnt, sizeof(mnt), "%s/" WK_DISK_MOUNT, sbdir) >= (int)sizeof(mnt)) {
        *why = SF_MSG_STATE_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if (pool_take(state_dir, disk_mib, inodes, img) < 0 && (rc = format(img, disk_mib, inodes)) < 0) {
        *why = "Cannot format the sandbox's disk image (mkfs.ext4); check free space under state_dir.";
        goto fail;
    }
    if ((img_fd = open(img, O_RDWR | O_CLOEXEC | O_NOFOLLOW)) < 0) {
        rc = -errno;
        *why = "Cannot open the sandbox's disk image; check state_dir.";
        goto fail;
    }
    if ((loop_fd = loop_attach(img_fd, dev, sizeof(dev))) < 0) {
        rc = loop_fd;
        *why = "No free loop device for the sandbox's disk; raise the loop module's max_loop or kill sandboxes.";
        goto fail;
    }
    if (mkdir(mnt, 0755) < 0 && errno != EEXIST) {
        rc = -errno;
        *why = "Cannot create the sandbox's disk mount point; check state_dir.";
        goto fail;
    }
    if (mount(dev, mnt, "ext4", MS_NODEV | MS_NOSUID | MS_NOATIME, "noinit_itable") < 0) {
        rc = -errno;
        *why = "Cannot mount the sandbox's disk image (ext4 on a loop device).";
        goto fail;
    }
    /* The fs holds the loop device now; it detaches itself at the unmount. */
    close(loop_fd);
    loop_fd = -1;
    close(img_fd);
    img_fd = -1;
    if ((fsfd = open(mnt, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        (rc = wk_layer_dirs(fsfd, host_uid)) < 0) {
        rc = fsfd < 0 ? -errno : rc;
        *why = "Cannot prepare the sandbox's disk.";
        if (fsfd >= 0)
            close(fsfd);
        umount2(mnt, MNT_DETACH);
        goto fail;
    }
    close(fsfd);
    return 0;
fail:
    if (loop_fd >= 0)
        close(loop_fd);
    if (img_fd >= 0)
        close(img_fd);
    unlink(img);
    return rc;
}
