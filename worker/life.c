/* life.c: a sandbox's lifecycle on this host: sandbox_pause and sandbox_resume, the
 * auto-resume of tools that declare `resume`, and the timers (state/sf_timers.h) that
 * live in Redis and fire here: the lifetime (timeout_seconds, or the platform default)
 * and auto-delete kill, idle pauses. A tick pops what is due from this host's timers;
 * each timer fires once. */
#include "worker.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_timers.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DUE_MAX 64 /* timers popped per tick */

typedef void (*life_done)(wk_call *c, int rc, const char *why);

typedef struct life_op {
    wk_ctx *ctx;
    char id[SF_ID_MAX];
    wk_call *c;     /* NULL: the idle timer's pause */
    life_done done;
    void (*done_for)(void *arg, int rc, const char *why); /* wk_box_resume_for */
    void *arg;
} life_op;

static life_op *op_new(wk_box *b, wk_call *c, life_done done)
{
    life_op *op = calloc(1, sizeof(*op));

    if (!op)
        return NULL;
    op->ctx = b->ctx;
    snprintf(op->id, sizeof(op->id), "%s", b->id);
    op->c = c;
    op->done = done;
    return op;
}

/* The box of op, if it is still one this host runs. */
static wk_box *op_box(const life_op *op)
{
    wk_box *b = sf_map_get(op->ctx->sandboxes, op->id);
    return b && b->state == WK_BOX_RUNNING ? b : NULL;
}

/* The op's end: its caller hears the outcome. */
static void op_end(life_op *op, int rc, const char *why)
{
    if (rc < 0 && !op->c)
        sf_warn("msg=\"idle pause failed\" sandbox=%s rc=%d why=\"%s\"", op->id, rc,
                why ? why : "");
    if (op->done_for)
        op->done_for(op->arg, rc, why);
    else if (op->done)
        op->done(op->c, rc, why);
    free(op);
}

/* The record says paused (or running again): only now is the call answered. The state
 * write is a script, and on a Redis that lacks it yet (first use, a restart, SCRIPT FLUSH)
 * it goes again by its source after what was queued meanwhile, the reply's guard write
 * included: a caller reading the record right after the answer saw the old state. */
static void on_recorded(redisAsyncContext *ac, void *r, void *priv)
{
    wk_redis_logged(ac, r, NULL);
    op_end(priv, 0, NULL);
}

static void on_paused(void *arg, int rc, const char *why)
{
    life_op *op = arg;
    wk_box *b = op_box(op);

    if (b) {
        int was_pausing = b->pausing; /* 0: a resume came first */
        b->pausing = 0;
        if (rc == 0 && was_pausing && !b->paused) {
            json_t *x = json_pack("{s:s}", "by", op->c ? "call" : "idle");
            int rec;
            b->paused = 1;
            sf_info("msg=\"sandbox paused\" sandbox=%s by=%s", b->id, op->c ? "call" : "idle");
            wk_event(op->ctx, "paused", b->team, b->id, x);
            json_decref(x);
            rec = sf_timers_paused(op->ctx->redis, b->id, op->ctx->host_id, sf_now_ms(),
                                   on_recorded, op);
            if (rec == 0)
                return; /* answered once recorded */
            sf_warn("msg=\"cannot record the pause; Redis is down\" sandbox=%s", b->id);
        }
    }
    op_end(op, rc, why);
}

int wk_box_pause(wk_box *b, wk_call *c, life_done done)
{
    life_op *op;
    int rc;

    if (b->paused) {
        if (done)
            done(c, 0, NULL);
        return 0;
    }
    if (!b->ctx->ops->pause)
        return -ENOTSUP;
    if (!(op = op_new(b, c, done)))
        return -ENOMEM;
    b->pausing = 1;
    if ((rc = b->ctx->ops->pause(b->sb, on_paused, op)) < 0) {
        b->pausing = 0;
        free(op);
    }
    return rc;
}

static void on_resumed(void *arg, int rc, const char *why)
{
    life_op *op = arg;
    wk_box *b = op_box(op);

    if (b && rc == 0) {
        int was = b->paused;
        b->paused = 0;
        b->pausing = 0;
        b->last_active_ms = sf_mono_ms();
        if (was) {
            sf_info("msg=\"sandbox resumed\" sandbox=%s", b->id);
            wk_event(op->ctx, "resumed", b->team, b->id, NULL);
            if (sf_timers_resumed(op->ctx->redis, b->id, op->ctx->host_id, sf_now_ms(),
                                  on_recorded, op) == 0)
                return; /* answered once recorded */
            sf_warn("msg=\"cannot record the resume; Redis is down\" sandbox=%s", b->id);
        }
    }
    if (op->done_for)
        op->done_for(op->arg, rc, why);
    else if (op->done)
        op->done(op->c, rc, why);
    free(op);
}

int wk_box_resume(wk_box *b, wk_call *c, life_done done)
{
    life_op *op;
    int rc;

    if (!b->paused && !b->pausing) {
        done(c, 0, NULL);
        return 0;
    }
    if (!b->ctx->ops->resume)
        return -ENOTSUP;
    if (!(op = op_new(b, c, done)))
        return -ENOMEM;
    if ((rc = b->ctx->ops->resume(b->sb, on_resumed, op)) < 0)
        free(op);
    return rc;
}

int wk_box_resume_for(wk_box *b, void (*done)(void *arg, int rc, const char *why), void *arg)
{
    life_op *op;
    int rc;

    if (!b->paused && !b->pausing) {
        done(arg, 0, NULL);
        return 0;
    }
    if (!b->ctx->ops->resume)
        return -ENOTSUP;
    if (!(op = op_new(b, NULL, NULL)))
        return -ENOMEM;
    op->done_for = done;
    op->arg = arg;
    if ((rc = b->ctx->ops->resume(b->sb, on_resumed, op)) < 0)
        free(op);
    return rc;
}

/* ---- the tools ---- */

static void state_error(wk_call *c, int rc, const char *why, const char *what)
{
    char text[320];

    if (rc == -ESRCH) {
        snprintf(text, sizeof(text), SF_MSG_SANDBOX_KILLED_FMT, c->job.sandbox);
        wk_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    if (rc == -ENOTSUP) {
        wk_reply_error(c, SF_ERR_INVALID, "This host's isolation driver cannot pause sandboxes; "
                       "kill the sandbox instead when it is no longer needed.");
        return;
    }
    snprintf(text, sizeof(text), "%s", why ? why : "");
    if (!why)
        snprintf(text, sizeof(text), "The sandbox could not be %s (error %d); retry, or kill "
                 "it and create a new one.", what, -rc);
    wk_reply_error(c, rc == -EAGAIN || rc == -ETIMEDOUT || rc == -ECANCELED ? SF_ERR_UNAVAILABLE
                                                                              : SF_ERR_INTERNAL,
                   text);
}

static void pause_answered(wk_call *c, int rc, const char *why)
{
    if (rc < 0) {
        state_error(c, rc, why, "paused");
        return;
    }
    wk_reply_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "paused"));
}

static void resume_answered(wk_call *c, int rc, const char *why)
{
    if (rc < 0) {
        state_error(c, rc, why, "resumed");
        return;
    }
    wk_reply_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "active"));
}

static void do_pause(wk_call *c, wk_box *b)
{
    int rc = wk_box_pause(b, c, pause_answered);

    if (rc < 0)
        state_error(c, rc, NULL, "paused");
}

static void do_resume(wk_call *c, wk_box *b)
{
    int rc = wk_box_resume(b, c, resume_answered);

    if (rc < 0)
        state_error(c, rc, NULL, "resumed");
}

/* ---- timers ---- */

void wk_life_started(wk_box *b, const json_t *args)
{
    wk_ctx *ctx = b->ctx;
    int64_t now = sf_now_ms(), lifetime_at = now + ctx->cfg.lifetime_s * 1000;
    json_int_t t = json_integer_value(json_object_get(args, "timeout_seconds"));
    json_int_t ad = json_integer_value(json_object_get(args, "auto_delete_seconds"));

    b->last_active_ms = sf_mono_ms();
    if (sf_timers_start(ctx->redis, b->id, ctx->host_id, now,
                        t > 0 ? now + (int64_t)t * 1000 : lifetime_at, lifetime_at,
                        ctx->ops->pause ? ctx->cfg.idle_pause_ms : 0, /* no pause: no idle */
                        ad > 0 ? (int64_t)ad : 0, wk_redis_logged,
                        NULL) < 0)
        sf_warn("msg=\"cannot set the sandbox's timers; Redis is down\" sandbox=%s", b->id);
}

static void life_touch(wk_ctx *ctx, const char *id)
{
    if (ctx->cfg.idle_pause_ms > 0)
        sf_timers_touch(ctx->redis, id, ctx->host_id, sf_now_ms(), wk_redis_logged, NULL);
}

/* A sandbox's last_active and idle timer in Redis move at most once a second (two
 * scripts per call were two of a job's seven Redis round trips). What decides an idle
 * pause is last_active_ms here, which every call moves: a timer that comes due early
 * because a write was skipped is set again for the time left (life.c, idle_due). So
 * last_active in the record may lag the last call by up to WK_TOUCH_EVERY_MS. */
#define WK_TOUCH_EVERY_MS 1000

void wk_touch(wk_ctx *ctx, const char *id)
{
    wk_box *b = sf_map_get(ctx->sandboxes, id);
    int64_t now = sf_mono_ms();

    if (b) {
        b->last_active_ms = now;
        if (b->touched_ms && now - b->touched_ms < WK_TOUCH_EVERY_MS)
            return;
        b->touched_ms = now;
    }
    sf_records_touch(ctx->redis, id, sf_now_ms(), wk_redis_logged, NULL);
    life_touch(ctx, id);
}


/* An idle timer came due: the sandbox pauses unless a call runs or came since. */
static void idle_due(wk_ctx *ctx, wk_box *b)
{
    int64_t quiet = sf_mono_ms() - b->last_active_ms, rc;

    if (b->paused || b->pausing)
        return;
    if (b->calls > 0 || quiet < ctx->cfg.idle_pause_ms) {
        int64_t wait = b->calls > 0 ? ctx->cfg.idle_pause_ms : ctx->cfg.idle_pause_ms - quiet;
        sf_timers_set(ctx->redis, ctx->host_id, SF_TIMER_IDLE, b->id, sf_now_ms() + wait,
                      wk_redis_logged, NULL);
        return;
    }
    if ((rc = wk_box_pause(b, NULL, NULL)) < 0)
        sf_warn("msg=\"idle pause failed\" sandbox=%s rc=%lld", b->id, (long long)rc);
}

static void fire(wk_ctx *ctx, const char *member)
{
    const char *id = member + 2;
    wk_box *b;

    if (strlen(member) < 3 || member[1] != ':' || !sf_id_valid(id))
        return;
    b = sf_map_get(ctx->sandboxes, id);
    switch (member[0]) {
    case SF_TIMER_TIMEOUT:
    case SF_TIMER_DELETE:
        sf_info("msg=\"sandbox %s\" sandbox=%s", member[0] == SF_TIMER_TIMEOUT
                ? "lifetime reached" : "paused past auto_delete_seconds", id);
        if (b)
            wk_box_kill(b, "killed");
        else if (sf_records_retire(ctx->redis, id, "lost", 1, wk_redis_logged, NULL) < 0)
            sf_warn("msg=\"cannot retire a sandbox; Redis is down\" sandbox=%s", id);
        break;
    case SF_TIMER_IDLE:
        if (b && b->state == WK_BOX_RUNNING)
            idle_due(ctx, b);
        break;
    }
}

static void on_due(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_ctx *ctx = priv;

    (void)ac;
    ctx->timers_asking = 0;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        if (rep && rep->type == REDIS_REPLY_ERROR)
            sf_warn("msg=\"cannot read the timers\" err=\"%s\"", rep->str);
        return;
    }
    if (ctx->stopping)
        return;
    for (size_t i = 0; i < rep->elements; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING)
            fire(ctx, rep->element[i]->str);
}

static void on_timer_tick(evutil_socket_t fd, short what, void *arg)
{
    wk_ctx *ctx = arg;

    (void)fd;
    (void)what;
    if (ctx->timers_asking || ctx->stopping || !sf_redis_connected(ctx->redis))
        return;
    if (sf_timers_due(ctx->redis, ctx->host_id, sf_now_ms(), DUE_MAX, on_due, ctx) == 0)
        ctx->timers_asking = 1;
}

int wk_life_start(wk_ctx *ctx)
{
    struct timeval tv = {ctx->cfg.timer_tick_ms / 1000, (ctx->cfg.timer_tick_ms % 1000) * 1000};

    if (!(ctx->ev_timers = event_new(ctx->d.base, -1, EV_PERSIST, on_timer_tick, ctx)))
        return -ENOMEM;
    return event_add(ctx->ev_timers, &tv) == 0 ? 0 : -EIO;
}

void wk_life_stop(wk_ctx *ctx)
{
    if (ctx->ev_timers)
        event_free(ctx->ev_timers);
    ctx->ev_timers = NULL;
}

WK_HANDLERS({"sandbox_pause", do_pause}, {"sandbox_resume", do_resume});
