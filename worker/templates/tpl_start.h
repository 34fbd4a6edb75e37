/* tpl_start.h: a template's service in a sandbox (README.md, "Templates"). start_cmd runs
 * detached in the background (its own session; stdout and stderr in WK_START_LOG inside
 * the sandbox), then ready_cmd runs until it exits 0 (every 100 ms at first, backing off
 * to once a second) or the deadline passes. Every create from a template that has them
 * waits for it before it is answered (create.c); a template's build checks it last
 * (tpl_build.c). Everything runs on the event loop, through the driver's exec. */
#ifndef WK_TPL_START_H
#define WK_TPL_START_H

#include "worker.h"

#define WK_START_LOG "/tmp/sandfleet-start.log"

typedef struct wk_tpl_start_req {
    const char *start_cmd;     /* NULL: none (ready_cmd alone is polled) */
    const char *ready_cmd;     /* NULL: ready once start_cmd was started */
    const char *const *env;    /* NULL or NULL-terminated "K=V" (copied) */
    int64_t deadline_ms;       /* sf_now_ms() clock: ready_cmd is not run after it */
    /* NULL, or returns 1 when its caller gave up (the sandbox is being killed): the
     * polling stops and cb gets -ECANCELED */
    int (*gone)(void *arg);
} wk_tpl_start_req;

/* rc 0: ready. -ECANCELED: gone said so. -ETIMEDOUT: ready_cmd never succeeded (why: the
 * command, its last exit status and output, and the end of start_cmd's log). -EIO: a
 * command could not run (why: the driver's sentence). why is one clause, without a
 * capital or a full stop, for the caller's sentence. */
typedef void (*wk_tpl_start_cb)(void *arg, int rc, const char *why);

/* Starts it on sb; cb(arg, ...) once, later (never inside this call). 0 or -ENOMEM. */
int wk_tpl_start(wk_ctx *ctx, wk_sandbox *sb, const wk_tpl_start_req *req, wk_tpl_start_cb cb,
                 void *arg);

/* For a sandbox being created (b->create set, the driver and its egress ready): the
 * service of its template (from_template), with the sandbox's environment, until the
 * create's deadline. 1: the template has none (nothing started); 0: started, done(b, rc,
 * why) follows (rc as above; -ECANCELED also when the worker is stopping); -ENOMEM. */
int wk_tpl_start_box(wk_box *b, void (*done)(wk_box *b, int rc, const char *why));

#endif
