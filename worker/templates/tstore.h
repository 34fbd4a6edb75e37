/* tstore.c: this host's template store: what root filesystem layers a sandbox of a
 * template starts from (README.md, "Templates").
 *   base     the driver's own busybox root (template.c): no layers
 *   debian   templates_dir/debian/rootfs, built once per host by tpl/build-debian in the
 *            background (first use or start-up) and shared by every worker of the host
 *   desktop  templates_dir/desktop/rootfs: 'debian' plus a GUI desktop, built the same way by
 *            tpl/build-desktop on its first create (drivers with WK_CAP_DESKTOP: the jail)
 *   a team's state_dir/templates/team/<team>/<name>/rootfs: one whole root filesystem
 *            (a copy of its `from` changed by its run_steps) */
#ifndef WK_TSTORE_H
#define WK_TSTORE_H

#include "driver.h"

#include <stddef.h>

typedef struct wk_tstore wk_tstore;

/* templates_dir: the built-in templates shared by this host's workers; state_dir: this
 * worker's; ops, drv: the host's driver: when it runs 'debian' (WK_CAP_DEBIAN) its build
 * starts now if it is missing, and a driver with tpl_image gets the tree to make its own
 * image of (qemu: 'debian' is ready when that image is). Free the store before the driver. */
int wk_tstore_new(const char *templates_dir, const char *state_dir, const wk_driver_ops *ops,
                  wk_driver *drv, wk_tstore **out);
/* Stops a running build script and waits for it to end; no tpl_image call after it. NULL-safe. */
void wk_tstore_free(wk_tstore *ts);

/* The layers of template name for team, top first, NULL-terminated in out (malloc'd
 * strings; none for 'base'). 0; -EAGAIN ('debian' is still being built: retry later);
 * -ENOENT (no such template on this host); -ENAMETOOLONG; why gets the caller's sentence. */
int wk_tstore_layers(wk_tstore *ts, const char *team, const char *name,
                     char *out[WK_LAYERS_MAX + 1], char *why, size_t whylen);
void wk_tstore_layers_free(char *l[WK_LAYERS_MAX + 1]);

/* 1 when 'debian' is ready on this host (the heartbeat publishes it). */
int wk_tstore_debian_ready(wk_tstore *ts);
/* For the heartbeat: '1' ready, 'b' being built here, '0' absent (or its build failed).
 * Looks on disk when not ready (a template built by another worker or by hand). With a
 * driver's tpl_image, '1' needs its image too ('b' while it is made, '0' if that failed). */
char wk_tstore_debian_state(wk_tstore *ts);

/* For the heartbeat: the same for 'desktop' ('0' on a driver without WK_CAP_DESKTOP). */
char wk_tstore_desktop_state(wk_tstore *ts);

/* The service of template name for team (tpl_start.h): its start_cmd and ready_cmd
 * (malloc'd; NULL when it has none), from service.json in its directory, which its build
 * wrote. 'desktop' has its own (WK_DESKTOP_*), the other built-ins none. 0, -ENOENT (not on this host), -ENOMEM. */
int wk_tstore_service(wk_tstore *ts, const char *team, const char *name, char **start,
                      char **ready);
#define WK_TSTORE_SERVICE "service.json" /* beside rootfs: {start_cmd, ready_cmd} */
/* The 'desktop' template's service (tpl/desktop/sandfleet-desktop): the display :0, its
 * panel and the live view; ready once the display answers. */
#define WK_DESKTOP_START "exec /usr/local/bin/sandfleet-desktop"
#define WK_DESKTOP_READY "xdpyinfo -display :0 >/dev/null 2>&1"

/* A new place for a deleted template's directory (state_dir/templates/trash/<id>; the
 * trash is emptied at start-up), its parent created. 0 or -errno. */
int wk_tstore_trash_path(const wk_tstore *ts, const char *id, char *buf, size_t n);

/* The directory of a team's template (state_dir/templates/team/<team>/<name>). */
int wk_tstore_team_dir(const wk_tstore *ts, const char *team, const char *name, char *buf,
                       size_t n);

#endif
