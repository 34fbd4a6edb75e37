/* Host-side files of jail sandboxes: uid slots, the per-sandbox directory and
 * its removal.
 *
 * uid slots: sandbox slot s maps its uids/gids 0..65535 to host
 * uid_base + s*65536 .. + 65535. A slot is claimed with an flock on
 * WK_UID_LOCK_DIR/<first host uid>.lock, held for the sandbox's life, so
 * workers (and tests) on one host never share a range; a crashed worker's
 * locks vanish with it.
 *
 * state_dir/sandboxes/<id>/ (owned by the sandbox's root, 0700):
 *   disk.img the sandbox's ext4 image (jail_disk.c)
 *   fs/      its mount point (in the worker's mount namespace); on it:
 *     upper/ overlay upper layer; root/ (0700), tmp/ (1777), home/, run/ are
 *            pre-created here so they belong to the sandbox's root, while the
 *            template's other directories stay host root's (read-only inside)
 *     work/  overlay work directory
 *   rootfs/  overlay mount point (only inside the sandbox's mount namespace) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail_int.h"
#include "safefs.h"

/* Creates run from pool threads: the hint and the directory check are shared. */
static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;

int wk_slot_acquire(uint32_t uid_base, uint32_t *host_uid, int *lock_fd)
{
    static uint32_t hint;
    static int dir_ready;
    uint32_t nslots = (UINT32_MAX - uid_base) / WK_UID_RANGE;
    char path[128];
    int rc = -EAGAIN;

    if (nslots > WK_SLOTS_MAX)
        nslots = WK_SLOTS_MAX;
    if (nslots == 0)
        return -EINVAL;
    pthread_mutex_lock(&slot_mu);
    if (!dir_ready) {
        if ((rc = wk_mkdir_p(WK_UID_LOCK_DIR, 0700)) < 0)
            goto out;
        dir_ready = 1;
        rc = -EAGAIN;
    }
    for (uint32_t i = 0; i < nslots; i++) {
        uint32_t s = (hint + i) % nslots, uid = uid_base + s * WK_UID_RANGE;
        int fd;

        snprintf(path, sizeof(path), WK_UID_LOCK_DIR "/%u.lock", uid);
        if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
            rc = -errno;
            goto out;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            hint = s + 1;
            *host_uid = uid;
            *lock_fd = fd;
            rc = 0;
            goto out;
        }
        close(fd);
    }
out:
    pthread_mutex_unlock(&slot_mu);
    return rc;
}

/* The per-sandbox directory on the host: mount points only. */
static const char *const sb_dirs[] = {WK_DISK_MOUNT, "rootfs"};

/* The writable layer on the sandbox's own disk, owned by its root. */
static const struct {
    const char *name;
    mode_t mode;
} layer_dirs[] = {
    {"upper", 0755},      {"work", 0700},       {"upper/root", 0700},
    {"upper/tmp", 01777}, {"upper/home", 0755}, {"upper/run", 0755},
};

int wk_layer_dirs(int fsfd, uint32_t host_uid)
{
    for (size_t i = 0; i < sizeof(layer_dirs) / sizeof(layer_dirs[0]); i++)
        if (mkdirat(fsfd, layer_dirs[i].name, 0700) < 0 ||
            fchownat(fsfd, layer_dirs[i].name, host_uid, host_uid, AT_SYMLINK_NOFOLLOW) < 0 ||
            fchmodat(fsfd, layer_dirs[i].name, layer_dirs[i].mode, 0) < 0)
            return -errno;
    return 0;
}

int wk_sbdir_create(const char *sbdir, uint32_t host_uid, const char **why)
{
    int fd, rc = 0;

    if (mkdir(sbdir, 0700) < 0) {
        rc = -errno;
        *why = rc == -EEXIST ? "A sandbox with this id already exists on this host; pick another id."
                             : "Cannot create the sandbox directory; check that state_dir/sandboxes is writable.";
        return rc;
    }
    if ((fd = open(sbdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fchown(fd, host_uid, host_uid) < 0)
        goto fail;
    for (size_t i = 0; i < sizeof(sb_dirs) / sizeof(sb_dirs[0]); i++)
        if (mkdirat(fd, sb_dirs[i], 0755) < 0)
            goto fail;
    close(fd);
    return 0;
fail:
    rc = -errno;
    if (fd >= 0)
        close(fd);
    wk_rmtree(sbdir);
    *why = "Cannot prepare the sandbox directory; check state_dir.";
    return rc;
}
