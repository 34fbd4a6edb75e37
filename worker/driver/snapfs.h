/* Files of a snapshot (driver.h `snapshot`), for the drivers and the worker's snapshot
 * module: blocking helpers, for the thread pool. */
#ifndef WK_SNAPFS_H
#define WK_SNAPFS_H

#include <stddef.h>
#include <stdint.h>

#define WK_SNAP_META "meta" /* in a snapshot's directory: "<driver> <driver's own words>\n" */

/* Copies the tree (or file) from to `to` (`cp -a --sparse=always`: owners, modes, times,
 * extended attributes, special files, holes). `to` must not exist, or be a directory
 * when from ends in "/.". 0 or -errno (-EIO: cp failed). */
int wk_snap_copy(const char *from, const char *to);
/* The bytes a tree holds on disk (allocated blocks; not crossing mounts). */
uint64_t wk_snap_bytes(const char *root);
/* The same, and the count of its files and directories in *files (NULL: not wanted). */
uint64_t wk_snap_measure(const char *root, uint64_t *files);
/* Writes dir/meta ("<driver> <words>\n"), or reads it into buf: 0 or -errno (-ESTALE: it
 * names another driver). */
int wk_snap_meta_write(const char *dir, const char *driver, const char *words);
int wk_snap_meta_read(const char *dir, const char *driver, char *buf, size_t n);

#endif
