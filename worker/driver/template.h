/* template.c: the base template's root filesystem (busybox), shared by the drivers (the
 * jail's layers, the qemu driver's guest). Blocking; at host init. */
#ifndef WK_TEMPLATE_H
#define WK_TEMPLATE_H

#include <stddef.h>

/* Builds state_dir/templates/base/rootfs once (atomically, by rename). */
int wk_template_ensure(const char *state_dir, const char **why);
/* Writes state_dir/templates/base/rootfs; -ENAMETOOLONG. */
int wk_template_path(const char *state_dir, char *buf, size_t n);
/* Removes unfinished builds (templates/base/rootfs.tmp-*). */
void wk_template_cleanup(const char *state_dir);

#endif
