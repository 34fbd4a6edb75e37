/* restart.c: a worker restart (a crash, kill -9, SIGTERM for an upgrade) keeps the host's
 * sandboxes (docs/internals/restart.md).
 *
 * Each running sandbox has a host-side record, state_dir/boxes/<id>.json (the folder
 * root's, 0700; written whole and renamed into place): its team, template, shape, env,
 * egress (rules, bindings, placeholders, the proxy instance it is registered with) and
 * published preview ports with their epochs. What the driver needs (the init's pid and
 * start time, its sockets) the driver keeps itself (driver.h adopt). The timers and the
 * sandbox's Redis record need nothing: they stay as they are.
 *
 * At start the worker takes back every sandbox it has a record of whose driver says it
 * still lives; the others are retired as `lost`, each with an event and a log line saying
 * why. On SIGTERM (or any stop) the running sandboxes stay up for the next worker;
 * `sandfleet hosts drain HOST` empties a host instead. */
#ifndef WK_RESTART_H
#define WK_RESTART_H

#include "worker.h"

/* Opens (makes) state_dir/boxes: 0, or -errno (then nothing is kept across restarts). */
int wk_restart_init(wk_ctx *ctx);
/* Writes b's record (after its create answered, and after each change it keeps: egress,
 * previews). Loop thread; small and bounded; a failure is logged. */
void wk_restart_save(wk_box *b);
/* b is gone: its record too. */
void wk_restart_forget(wk_ctx *ctx, const char *id);
/* At start-up, before any job (the driver's host_init ran; egress is up): takes back the
 * sandboxes of the previous run (ctx->sandboxes), then has the driver remove the rest.
 * Fills lost (an array of {id, team, why}) for the retiring. */
void wk_restart_adopt(wk_ctx *ctx, json_t *lost);
/* 1 when id was taken back (reconcile leaves its record and timers). */
int wk_restart_adopted(const char *id, void *ctx);
/* At a stop: every running sandbox stays up (the driver's keep); then, once the driver
 * is gone, their memory is freed without touching their records. 0 when the driver cannot
 * keep sandboxes (they are killed as before). */
int wk_restart_keep_all(wk_ctx *ctx);
void wk_restart_free_kept(wk_ctx *ctx);

#endif
