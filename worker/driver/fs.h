/* fs.c: host-side file helpers shared by the drivers and the worker. Blocking. */
#ifndef WK_FS_H
#define WK_FS_H

#include <stdint.h>
#include <sys/types.h>

#define WK_PATH_MAX 4096

/* Creates path and its missing parents with mode (existing ones untouched): 0 or -errno. */
int wk_mkdir_p(const char *path, mode_t mode);
/* Removes a directory tree without following symlinks, any depth, O(1) fds, never
 * crossing into another file system: 0 (also when it is not there) or -errno. */
int wk_rmtree(const char *path);
/* Gives every file under root (not crossing mounts) whose uid/gid is in [from, from+65536)
 * to to + (id - from), and every other id to to + 65534; set-id bits survive. Blocking.
 * 0 or -errno. */
int wk_tree_shift(const char *root, uint32_t from, uint32_t to);

#endif
