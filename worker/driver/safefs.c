/* safefs.c: host-side file access that cannot leave its tree (safefs.h). openat2 with
 * RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS through syscall(2) (glibc 2.36 has no wrapper),
 * and where the kernel has none a walk of O_NOFOLLOW opens, one component at a time. */
#include "safefs.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SFS_PATH_MAX 4096
#define SFS_WALK_MAX 256 /* components of one path (the walk) */

static int walk_forced = -1; /* SF_SAFEFS_FORCE_WALK, read once */
static int no_openat2;       /* the kernel said ENOSYS once */

int wk_sfs_name_ok(const char *name)
{
    return name && name[0] && strcmp(name, ".") != 0 && strcmp(name, "..") != 0 &&
           !strchr(name, '/');
}

static int use_walk(int mode)
{
    if (mode == WK_SFS_WALK)
        return 1;
    if (mode == WK_SFS_OPENAT2)
        return 0;
    if (walk_forced < 0) {
        const char *e = getenv("SF_SAFEFS_FORCE_WALK");
        walk_forced = e && e[0] == '1';
    }
    return walk_forced || __atomic_load_n(&no_openat2, __ATOMIC_RELAXED);
}

static int via_openat2(int root, const char *path, int flags)
{
    struct open_how how = {
        .flags = (uint64_t)(flags | O_CLOEXEC),
        .mode = 0,
        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    long fd;

    do
        fd = syscall(SYS_openat2, root, path, &how, sizeof(how));
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : (int)fd;
}

/* Each component opened from its parent's fd with O_NOFOLLOW: a symlink anywhere is
 * refused (ELOOP / ENOTDIR), ".." is refused (-EXDEV). */
static int via_walk(int root, const char *path, int flags)
{
    char buf[SFS_PATH_MAX];
    char *p, *next;
    int cur, n = 0;

    if (strlen(path) >= sizeof(buf))
        return -ENAMETOOLONG;
    memcpy(buf, path, strlen(path) + 1);
    if ((cur = fcntl(root, F_DUPFD_CLOEXEC, 0)) < 0)
        return -errno;
    p = buf;
    for (;;) {
        int fd;
        while (*p == '/')
            p++;
        next = strchr(p, '/');
        if (next)
            *next++ = '\0';
        while (next && *next == '/')
            next++;
        if (next && !*next)
            next = NULL; /* a trailing slash: p is the last component */
        if (!*p || strcmp(p, ".") == 0) {
            if (!next) { /* the path names cur itself */
                fd = openat(cur, ".", flags | O_CLOEXEC);
                close(cur);
                return fd < 0 ? -errno : fd;
            }
            p = next;
            continue;
        }
        if (strcmp(p, "..") == 0 || ++n > SFS_WALK_MAX) {
            close(cur);
            return strcmp(p, "..") == 0 ? -EXDEV : -ELOOP;
        }
        if (!next) {
            fd = openat(cur, p, flags | O_NOFOLLOW | O_CLOEXEC);
            int rc = fd < 0 ? -errno : fd;
            close(cur);
            return rc;
        }
        fd = openat(cur, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(cur);
        if (fd < 0)
            return -errno;
        cur = fd;
        p = next;
    }
}

int wk_sfs_root(const char *root)
{
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int wk_sfs_open(int root, const char *path, int flags, int mode)
{
    int fd;

    if (!path || !*path || (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE)
        return -EINVAL;
    if (strlen(path) >= SFS_PATH_MAX)
        return -ENAMETOOLONG;
    if (!use_walk(mode)) {
        fd = via_openat2(root, path, flags);
        if (fd != -ENOSYS || mode == WK_SFS_OPENAT2)
            return fd;
        __atomic_store_n(&no_openat2, 1, __ATOMIC_RELAXED);
    }
    return via_walk(root, path, flags);
}

int wk_sfs_parent(int root, const char *path, const char **last, int mode)
{
    char dir[SFS_PATH_MAX];
    const char *slash;
    size_t n;
    int fd;

    if (!path || !*path)
        return -EINVAL;
    if ((n = strlen(path)) >= sizeof(dir))
        return -ENAMETOOLONG;
    slash = strrchr(path, '/');
    if (!wk_sfs_name_ok(slash ? slash + 1 : path))
        return -EINVAL;
    if (!slash || slash == path) {
        fd = fcntl(root, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            return -errno;
    } else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
        if ((fd = wk_sfs_open(root, dir, O_RDONLY | O_DIRECTORY, mode)) < 0)
            return fd;
    }
    *last = slash ? slash + 1 : path;
    return fd;
}

int wk_sfs_read_file(int root, const char *path, size_t max, char **out, size_t *len, int mode)
{
    struct stat st;
    char *buf;
    size_t n = 0;
    int fd, rc = 0;

    if ((fd = wk_sfs_open(root, path, O_RDONLY | O_NONBLOCK | O_NOCTTY, mode)) < 0)
        return fd;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        goto out;
    }
    if ((uint64_t)st.st_size > max) {
        rc = -EFBIG;
        goto out;
    }
    if (!(buf = malloc((size_t)st.st_size + 1))) {
        rc = -ENOMEM;
        goto out;
    }
    /* the file may grow while it is read: at most what fstat said */
    while (n < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            free(buf);
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
out:
    close(fd);
    return rc;
}

int wk_sfs_create(int root, const char *path, mode_t perm, int excl, int mode)
{
    const char *last;
    struct stat st;
    int dir, fd, rc = 0;

    if ((dir = wk_sfs_parent(root, path, &last, mode)) < 0)
        return dir;
    fd = openat(dir, last,
                O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC |
                    (excl ? O_EXCL : 0),
                perm);
    if (fd < 0)
        rc = -errno;
    else if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = -EINVAL; /* a FIFO or a device already there: never written */
        close(fd);
    } else if (!excl && ftruncate(fd, 0) < 0) {
        rc = -errno;
        close(fd);
    } else {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        rc = fd;
    }
    close(dir);
    return rc;
}

int wk_sfs_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int wk_sfs_mkdir(int root, const char *path, mode_t perm, int mode)
{
    const char *last;
    int dir, rc;

    if ((dir = wk_sfs_parent(root, path, &last, mode)) < 0)
        return dir;
    rc = mkdirat(dir, last, perm) < 0 ? -errno : 0;
    close(dir);
    return rc;
}

int wk_sfs_chmod(int root, const char *path, mode_t perm, uid_t uid, gid_t gid, int mode)
{
    struct stat st;
    int fd, rc = 0;

    /* O_NOFOLLOW on the last component in both modes: a link is refused, not changed */
    if ((fd = wk_sfs_open(root, path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW, mode)) < 0)
        return fd;
    if (fstat(fd, &st) < 0)
        rc = -errno;
    else if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        rc = -EINVAL;
    else if (uid != (uid_t)-1 && fchown(fd, uid, gid) < 0)
        rc = -errno;
    else if (fchmod(fd, perm) < 0)
        rc = -errno;
    close(fd);
    return rc;
}

int wk_sfs_unlink(int root, const char *path, int flags, int mode)
{
    const char *last;
    int dir, rc;

    if ((dir = wk_sfs_parent(root, path, &last, mode)) < 0)
        return dir;
    rc = unlinkat(dir, last, flags & AT_REMOVEDIR) < 0 ? -errno : 0;
    close(dir);
    return rc;
}

int wk_sfs_rename(int root, const char *from, const char *to, int mode)
{
    const char *lf, *lt;
    int df, dt, rc;

    if ((df = wk_sfs_parent(root, from, &lf, mode)) < 0)
        return df;
    if ((dt = wk_sfs_parent(root, to, &lt, mode)) < 0) {
        close(df);
        return dt;
    }
    rc = renameat(df, lf, dt, lt) < 0 ? -errno : 0;
    close(dt);
    close(df);
    return rc;
}

int wk_sfs_stat(int root, const char *path, struct stat *st, int mode)
{
    const char *last;
    struct stat s;
    int dir, rc;

    if ((dir = wk_sfs_parent(root, path, &last, mode)) < 0)
        return dir;
    rc = fstatat(dir, last, &s, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
    close(dir);
    if (rc == 0)
        *st = s;
    return rc;
}

DIR *wk_sfs_opendir_at(int dir, const char *name)
{
    DIR *d;
    int fd;

    if (!wk_sfs_name_ok(name)) {
        errno = EINVAL;
        return NULL;
    }
    if ((fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        return NULL;
    if (!(d = fdopendir(fd))) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return d;
}

int wk_sfs_rm_contents(int dir, int depth)
{
    struct dirent *de;
    DIR *d;
    int fd, first = 0;

    if (depth <= 0)
        return -ELOOP;
    if ((fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    if (!(d = fdopendir(fd))) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    while ((de = readdir(d))) {
        struct stat st;
        int rc = 0;
        if (!wk_sfs_name_ok(de->d_name))
            continue;
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            rc = errno == ENOENT ? 0 : -errno;
        else if (S_ISDIR(st.st_mode)) {
            int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0)
                rc = -errno;
            else {
                rc = wk_sfs_rm_contents(sub, depth - 1);
                close(sub);
            }
            if (unlinkat(fd, de->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT && rc == 0)
                rc = -errno;
        } else if (unlinkat(fd, de->d_name, 0) < 0 && errno != ENOENT)
            rc = -errno;
        if (rc < 0 && first == 0)
            first = rc;
    }
    closedir(d);
    return first;
}

static int walk_dir(int dir, dev_t dev, int depth, wk_sfs_visit fn, void *arg)
{
    struct dirent *de;
    DIR *d;
    int fd, rc = 0;

    if (depth <= 0)
        return -ELOOP;
    if ((fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    if (!(d = fdopendir(fd))) {
        rc = -errno;
        close(fd);
        return rc;
    }
    while (rc == 0 && (errno = 0, de = readdir(d))) {
        struct stat st;
        if (!wk_sfs_name_ok(de->d_name))
            continue;
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT)
                rc = -errno;
            continue;
        }
        if ((rc = fn(fd, de->d_name, &st, arg)) != 0)
            break;
        if (S_ISDIR(st.st_mode) && st.st_dev == dev) {
            int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                rc = -errno;
                break;
            }
            rc = walk_dir(sub, dev, depth - 1, fn, arg);
            close(sub);
        }
    }
    if (rc == 0 && errno != 0 && !de)
        rc = -errno;
    closedir(d);
    return rc;
}

int wk_sfs_walk(int root, int depth, wk_sfs_visit fn, void *arg)
{
    struct stat st;
    int rc;

    if (fstat(root, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    if ((rc = fn(root, ".", &st, arg)) != 0)
        return rc;
    return walk_dir(root, st.st_dev, depth, fn, arg);
}
