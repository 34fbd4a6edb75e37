/* Host-side file helpers every driver and the worker share: directories made along a
 * path, a tree removed without following its links, a tree's ids shifted. Blocking (for
 * the thread pool or start-up). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"
#include "safefs.h"

int wk_mkdir_p(const char *path, mode_t mode)
{
    char p[WK_PATH_MAX];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof(p))
        return -ENAMETOOLONG;
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        p[i] = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST)
            return -errno;
        p[i] = i == n ? '\0' : '/';
    }
    return 0;
}

/* The directories between the root of a removal and where it is, as (dev, ino):
 * climbing back through ".." must arrive exactly where the walk came down from,
 * or the walk stops (a directory renamed meanwhile could otherwise lead it out of
 * the tree). Costs 16 bytes per level, not a descriptor. */
typedef struct walk_stack {
    struct {
        dev_t dev;
        ino_t ino;
    } *v;
    size_t n, cap;
} walk_stack;

#define WALK_DEPTH_MAX (1u << 22)

static int stack_push(walk_stack *s, const struct stat *st)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        void *v;
        if (cap > WALK_DEPTH_MAX || !(v = realloc(s->v, cap * sizeof(*s->v))))
            return -ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].dev = st->st_dev;
    s->v[s->n].ino = st->st_ino;
    s->n++;
    return 0;
}

/* Empties the directory open at fd (closed here). Walks down into non-empty
 * subdirectories and back up through "..", so depth costs no descriptors: a
 * sandbox may leave trees deeper than PATH_MAX. Never crosses into another file
 * system. */
static int empty_dir(int fd)
{
    walk_stack stack = {0};
    struct stat st;
    int rc = 0;

    if (fstat(fd, &st) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    for (;;) {
        struct dirent *e;
        int down = -1, dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;

        if (!d) {
            rc = -errno;
            if (dfd >= 0)
                close(dfd);
            break;
        }
        while ((e = readdir(d))) {
            const char *n = e->d_name;
            struct stat cst;
            if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
                continue;
            if (unlinkat(fd, n, 0) == 0 || errno == ENOENT)
                continue;
            if (errno != EISDIR) {
                rc = -errno;
                break;
            }
            if (unlinkat(fd, n, AT_REMOVEDIR) == 0 || errno == ENOENT)
                continue;
            if (errno != ENOTEMPTY && errno != EEXIST) {
                rc = -errno;
                break;
            }
            if ((down = openat(fd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
                rc = -errno;
            } else if (fstat(down, &cst) < 0 || cst.st_dev != st.st_dev) {
                rc = cst.st_dev != st.st_dev ? -EXDEV : -errno; /* a mount point: not ours */
                close(down);
                down = -1;
            } else if ((rc = stack_push(&stack, &st)) < 0) {
                close(down);
                down = -1;
            } else {
                st = cst;
            }
            break;
        }
        closedir(d);
        if (rc < 0)
            break;
        if (down >= 0) {
            close(fd);
            fd = down;
            continue;
        }
        if (stack.n == 0)
            break;
        /* This level is empty: go up; the parent's rescan removes it. */
        down = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        close(fd);
        fd = down;
        if (fd < 0) {
            rc = -errno;
            break;
        }
        stack.n--;
        if (fstat(fd, &st) < 0 || st.st_dev != stack.v[stack.n].dev ||
            st.st_ino != stack.v[stack.n].ino) {
            rc = -ESTALE; /* moved while we walked: stop rather than leave the tree */
            break;
        }
    }
    if (fd >= 0)
        close(fd);
    free(stack.v);
    return rc;
}
int wk_rmtree(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), rc;

    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ENOTDIR || errno == ELOOP)
            return unlink(path) < 0 ? -errno : 0;
        return -errno;
    }
    if ((rc = empty_dir(fd)) < 0)
        return rc;
    return rmdir(path) < 0 && errno != ENOENT ? -errno : 0;
}

/* ---- template builds: a tree given to a sandbox's ids and back ------------------- */

typedef struct shift {
    uint32_t from, to;
} shift;

static uint32_t shift_id(const shift *s, uint32_t id)
{
    return id >= s->from && id - s->from < 65536 ? s->to + (id - s->from) : s->to + 65534;
}

/* One entry, through its parent's fd (safefs.h: the tree is the tenant's; a link is
 * changed itself, never what it names). */
static int shift_one(int dir, const char *name, const struct stat *st, void *arg)
{
    const shift *s = arg;

    if (fchownat(dir, name, shift_id(s, st->st_uid), shift_id(s, st->st_gid),
                 AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    /* chown clears set-user-ID and set-group-ID: put them back (files and directories
     * only, through an fd of each) */
    if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)) &&
        (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode)))
        return wk_sfs_chmod(dir, name, st->st_mode & 07777, (uid_t)-1, (gid_t)-1, WK_SFS_AUTO);
    return 0;
}

int wk_tree_shift(const char *root, uint32_t from, uint32_t to)
{
    shift s = {.from = from, .to = to};
    int fd = wk_sfs_root(root), rc;

    if (fd < 0)
        return fd;
    rc = wk_sfs_walk(fd, WK_SFS_DEPTH_MAX, shift_one, &s);
    close(fd);
    return rc;
}
