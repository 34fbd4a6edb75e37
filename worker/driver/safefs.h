/* safefs: host-side file access inside a tree a tenant can write (a template root, a
 * sandbox's disk mount, a snapshot directory). Every path is relative to a root directory
 * fd and resolves inside it: symlinks are followed as if the root were "/" (openat2
 * RESOLVE_IN_ROOT), magic links (/proc/self/fd/N, /proc/self/root, ...) are refused
 * (RESOLVE_NO_MAGICLINKS). Where the kernel has no openat2 (ENOSYS) each component is
 * opened with O_NOFOLLOW (a symlink is refused, ELOOP/ENOTDIR, never followed, and ".."
 * is refused, -EXDEV). So with openat2 a link that stays inside the root works (a distro's
 * ca-certificates.crt -> /etc/pki/...); with the walk it is refused; neither leaves.
 *
 * Writes, removals, renames, stats and mode changes act through the parent directory's fd
 * on a last component that is checked (not empty, ".", "..", no '/'), never by path, and
 * never follow a symlink in the last component.
 *
 * Reads of files open with O_NONBLOCK and check S_ISREG on the fd (a FIFO or a device
 * cannot hang a thread) and are bounded by the caller's max.
 *
 * All functions return 0 or a file descriptor (>= 0) on success, or -errno:
 *   -ELOOP / -EXDEV   the path left the root or crossed a symlink the mode refuses
 *   -EINVAL           a bad path (empty, a bad last component, O_CREAT given to open),
 *                     or not a regular file where one is read (a FIFO, a device)
 *   -EFBIG            a file larger than max
 * and whatever the kernel says (-ENOENT, -EACCES, -ENOTDIR, ...). Thread-safe; no logging. */
#ifndef SF_WORKER_SAFEFS_H
#define SF_WORKER_SAFEFS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Resolution modes: WK_SFS_AUTO tries openat2, then falls back on ENOSYS; the other two
 * force one path (the unit test runs both; SF_SAFEFS_FORCE_WALK=1 in the environment makes
 * AUTO take the walk, read once per process). */
enum { WK_SFS_AUTO = 0, WK_SFS_OPENAT2 = 1, WK_SFS_WALK = 2 };

/* Opens root (an absolute host path the worker owns, e.g. <sbdir>/disk/upper) as a
 * directory: the fd every other call is relative to. The root itself is opened with
 * O_NOFOLLOW on its last component; its parents are host-only paths. */
int wk_sfs_root(const char *root);

/* Opens path (relative; a leading '/' means the root) under root with flags (O_RDONLY,
 * O_DIRECTORY, O_PATH, ...; O_CREAT is refused: use wk_sfs_create). O_CLOEXEC and
 * O_NOFOLLOW (for the last component) are added. mode selects the resolution. */
int wk_sfs_open(int root, const char *path, int flags, int mode);

/* Opens the directory that holds path's last component and hands back that component
 * (a pointer into path; valid while path is). The component is checked. */
int wk_sfs_parent(int root, const char *path, const char **last, int mode);

/* Reads the regular file path under root into a malloc'd buffer (NUL-terminated, len
 * without the NUL). -ENOENT when absent, -EINVAL when not a regular file (FIFO, device,
 * directory), -EFBIG when larger than max. */
int wk_sfs_read_file(int root, const char *path, size_t max, char **out, size_t *len,
                     int mode);

/* Creates path (a file, mode perm) and returns its fd (O_WRONLY). excl: O_EXCL (fails
 * with -EEXIST); otherwise an existing regular file is truncated, anything else there
 * (a symlink, a FIFO) is refused (-ELOOP/-EINVAL). */
int wk_sfs_create(int root, const char *path, mode_t perm, int excl, int mode);

/* Writes n bytes to fd (retries EINTR and short writes). */
int wk_sfs_write_all(int fd, const void *p, size_t n);

/* mkdir path (perm); -EEXIST when something is there. */
int wk_sfs_mkdir(int root, const char *path, mode_t perm, int mode);

/* Changes the mode (and owner when uid != (uid_t)-1) of path through an fd of it
 * (O_PATH is not enough for fchmod: the object is opened O_RDONLY|O_NONBLOCK; symlinks
 * are refused). */
int wk_sfs_chmod(int root, const char *path, mode_t perm, uid_t uid, gid_t gid, int mode);

/* unlinkat(parent, last, flags) (flags: 0 or AT_REMOVEDIR). */
int wk_sfs_unlink(int root, const char *path, int flags, int mode);

/* renameat(parent(from), last, parent(to), last). */
int wk_sfs_rename(int root, const char *from, const char *to, int mode);

/* fstatat(parent, last, AT_SYMLINK_NOFOLLOW): a symlink is reported as one. */
int wk_sfs_stat(int root, const char *path, struct stat *st, int mode);

/* Opens the entry name of the directory fd dir as a directory (O_NOFOLLOW; -ENOTDIR or
 * -ELOOP for a symlink) and returns a DIR* of it via fdopendir, or NULL with errno set.
 * The walk step: recursion goes entry by entry, never by path. */
#include <dirent.h>
DIR *wk_sfs_opendir_at(int dir, const char *name);

/* Removes everything under the directory fd dir (not dir itself), never following a
 * link: each subdirectory opened O_NOFOLLOW from its parent's fd. depth bounds recursion
 * (-ELOOP beyond it). Keeps going after errors; returns the first. */
int wk_sfs_rm_contents(int dir, int depth);

/* Visits the tree under the directory fd root: fn(dir, name, st, arg) for root itself
 * (dir = root, name ".") and then every entry, parents before children, with dir an fd
 * of the entry's parent (act with *at(dir, name, ...) calls, AT_SYMLINK_NOFOLLOW, or
 * wk_sfs_chmod(dir, name, ...)). Never follows a link, never crosses into another file
 * system (FTW_PHYS | FTW_MOUNT), at most depth levels (-ELOOP past it: one fd each).
 * A nonzero return of fn (a -errno) stops the walk and is returned. */
#define WK_SFS_DEPTH_MAX 256 /* levels a walk of a tenant's tree goes down */
typedef int (*wk_sfs_visit)(int dir, const char *name, const struct stat *st, void *arg);
int wk_sfs_walk(int root, int depth, wk_sfs_visit fn, void *arg);

/* 1 when name is a usable last component: not empty, not "." or "..", no '/'. */
int wk_sfs_name_ok(const char *name);

#endif
