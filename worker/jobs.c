/* jobs.c: one host's job handling: create, exec and kill against the driver. */
#include "worker.h"
#include "tstore.h"
#include "tpl_start.h"
#include "egress.h"
#include "sf_claim.h"
#include "sf_events.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_tools.h"
#include "sf_trace.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define EXEC_CAP_BYTES 32768
#define EXEC_ENV_MAX 256

/* Ends the call; its offset is the caller's business (call_done, call_answer). */
static void call_free(wk_call *c)
{
    if (c->on_box) {
        wk_box *b = sf_map_get(c->ctx->sandboxes, c->job.sandbox);
        if (b && b->calls > 0)
            b->calls--;
    }
    sf_job_fini(&c->job);
    free(c);
}

static void call_done(wk_call *c)
{
    sf_jobq_done(c->ctx->jobq, c->ticket);
    call_free(c);
}

/* Sends a reply; its job's offset moves once Kafka confirmed it. Ends the call. */
static int call_answer(wk_call *c, const void *p, size_t n)
{
    int rc = sf_jobq_send(c->ctx->jobq, c->ctx->producer, c->job.reply, c->job.id, p, n, NULL,
                          c->ticket, c->job.id);

    if (rc < 0) {
        sf_error("msg=\"cannot produce reply\" job=%s rc=%d", c->job.id, rc);
        call_done(c);
        return rc;
    }
    call_free(c);
    return 0;
}

/* The job guard (sf:job:{id}, a hash; schemas/redis-keys.md) says where a job stands:
 * `running` on which worker process (host + instance), then `done` with its encoded reply,
 * kept until shortly after the job's deadline. A redelivered job (a restarted worker reads
 * its topic again from the last committed offset; a scheduler that died forwards again)
 * then gets its first answer again instead of a second run or silence. */
#define GUARD_REPLY_MAX (256 * 1024) /* larger replies are not kept for a repeat */

/* Its two scripts: sf_store_guard_begin, sf_store_guard_done (common/sf_store.c). */

/* This worker process among all that ever ran on the host (a restart is a new one). */
static char instance[SF_ID_MAX];

static long guard_ttl_s(const sf_job *job)
{
    int64_t left = job->deadline_ms - sf_now_ms();
    return (long)(left > 0 ? left / 1000 : 0) + 60;
}

/* The guard's keys, in its team's slot: the guard, the team's kept replies (zset) and
 * their bytes (counter). A job without a team counts under "-". */
static void guard_keys(const sf_job *job, char k[3][160])
{
    const char *team = job->team[0] ? job->team : "-";

    snprintf(k[0], 160, SF_RK_JOB, team, job->id);
    snprintf(k[1], 160, SF_RK_TEAM_GUARDS, team);
    snprintf(k[2], 160, SF_RK_TEAM_GUARD_BYTES, team);
}

#define MSG_GUARD_FULL                                                                        \
    "This team's recent answers, kept so a retried call gets the same answer, fill its "     \
    "budget (guard_team_mib, %lld MiB); retry in a minute, when the oldest have expired, "   \
    "or ask the operator to raise guard_team_mib."

typedef struct guard_done_arg {
    wk_call *c;   /* answered once the guard holds its reply */
    char id[SF_ID_MAX];
    char reply[SF_TOPIC_MAX];
    size_t len;
    char msg[]; /* the encoded reply */
} guard_done_arg;

/* The guard holds the reply (or Redis could not keep it): the reply goes out now. A repeat
 * of the job (same id, another reply topic) that arrived while it ran gets it too. */
static void on_guard_done(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    guard_done_arg *g = priv;
    wk_ctx *ctx = g->c->ctx;

    SF_TRACE(g->id, "kept", 0);
    if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"cannot keep the job's answer\" job=%s err=\"%s\"", g->id, rep->str);
    else if (rep && rep->type == REDIS_REPLY_STRING && rep->len > 0 && rep->len < SF_TOPIC_MAX &&
             strcmp(rep->str, g->reply) != 0 &&
             sf_kafka_produce(ctx->producer, rep->str, g->id, g->msg, g->len) < 0)
        sf_warn("msg=\"cannot produce reply\" job=%s topic=%s", g->id, rep->str);
    call_answer(g->c, g->msg, g->len);
    free(g);
}

/* Keeps the reply in the guard and sends it once Redis ran that: Redis runs a
 * connection's commands in order, so every write this worker made for the call (a kill's
 * `killing`, a create's record) is in place before its caller hears the answer and reads
 * state again. 0: the reply is on its way; -1: nothing was queued (send it now). */
static int guard_done(wk_call *c, const sf_buf *b)
{
    size_t keep = b->len <= GUARD_REPLY_MAX ? b->len : 0;
    guard_done_arg *g = malloc(sizeof(*g) + b->len + 1);
    char key[3][160], ttl[24], now[24], budget[24];
    const char *argv[8];
    size_t lens[8];

    if (!g)
        return -1;
    g->c = c;
    g->len = b->len;
    memcpy(g->msg, b->p ? b->p : "", b->len);
    snprintf(g->id, sizeof(g->id), "%s", c->job.id);
    snprintf(g->reply, sizeof(g->reply), "%s", c->job.reply);
    guard_keys(&c->job, key);
    snprintf(ttl, sizeof(ttl), "%ld", guard_ttl_s(&c->job));
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(budget, sizeof(budget), "%lld", (long long)(c->ctx->cfg.guard_team_mib << 20));
    argv[0] = key[0], argv[1] = key[1], argv[2] = key[2];
    argv[3] = keep ? g->msg : "", argv[4] = ttl, argv[5] = now, argv[6] = budget;
    argv[7] = c->job.id;
    for (size_t i = 0; i < 8; i++)
        lens[i] = i == 3 ? keep : strlen(argv[i]); /* the reply is binary: its own length */
    if (sf_redis_script_call(c->ctx->redis, &sf_store_guard_done, on_guard_done, g, 3, 5, argv,
                             lens) < 0) {
        sf_warn("msg=\"cannot keep the job's answer; Redis is down\" job=%s", c->job.id);
        free(g);
        return -1;
    }
    return 0;
}

/* Sends the encoded reply, keeps it in the guard, ends the call. */
static void reply_send(wk_call *c, sf_buf *b, int rc)
{
    if (rc < 0) {
        sf_error("msg=\"cannot encode reply\" job=%s rc=%d", c->job.id, rc);
        sf_buf_fini(b);
        call_done(c);
        return;
    }
    if (guard_done(c, b) < 0)
        call_answer(c, b->p, b->len);
    sf_buf_fini(b);
}

void wk_reply_error(wk_call *c, const char *code, const char *message)
{
    sf_buf b;

    sf_info("msg=\"job failed\" job=%s tool=%s sandbox=%s code=%s", c->job.id, c->job.tool,
            c->job.sandbox, code);
    sf_buf_init(&b, SF_MSG_MAX);
    reply_send(c, &b, sf_jobio_encode_error(&c->job, code, message, &b));
}

/* A result with large string fields: each goes to Redis first (a claim check), and the
 * reply names them. */
typedef struct big_reply {
    wk_call *c;
    json_t *result;
    sf_claims claims;  /* fields being stored */
    int pending, answered;
    int stored;        /* bit i: claims.name[i] is in Redis */
    int over, full, down;
    long long used;
} big_reply;

static void big_reply_finish(big_reply *br)
{
    wk_call *c = br->c;
    wk_ctx *ctx = c->ctx;
    char text[320];
    sf_buf b;
    int rc;

    if (br->over || br->full || br->down) {
        for (int i = 0; i < br->claims.n; i++)
            if (br->stored & (1 << i))
                sf_claim_drop(ctx->redis, c->job.team, c->job.id, 1, br->claims.name[i],
                              wk_redis_logged, NULL);
        if (br->full)
            snprintf(text, sizeof(text), "%s", SF_MSG_PLATFORM_FULL);
        else if (br->over)
            snprintf(text, sizeof(text), "Your team's large uploads and answers in flight "
                     "already hold %lld MiB, its limit; wait for other file calls to finish, "
                     "then retry.", (long long)(ctx->cfg.claim_team_mib));
        else
            snprintf(text, sizeof(text), "The platform's state store is unreachable, so the "
                     "large answer could not be handed over; retry in a few seconds.");
        json_decref(br->result);
        wk_reply_error(c, br->full || br->over ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE, text);
        free(br);
        return;
    }
    for (int i = 0; i < br->claims.n; i++)
        json_object_set_new(br->result, br->claims.name[i], json_string(""));
    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_jobio_encode_result(&c->job, br->result, &br->claims, &b);
    json_decref(br->result);
    free(br);
    reply_send(c, &b, rc);
}

static void on_claim_put(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    big_reply *br = priv;
    long long used = 0;
    int v = sf_claim_put_verdict(rep, &used), i = br->answered++; /* in the order sent */

    (void)ac;
    if (v == 1)
        br->stored |= 1 << i;
    else if (v == 0)
        br->over = 1;
    else if (sf_redis_is_oom(rep))
        br->full = 1;
    else
        br->down = 1;
    if (--br->pending == 0)
        big_reply_finish(br);
}

void wk_reply_result(wk_call *c, json_t *result)
{
    big_reply *br = NULL;
    const char *key;
    json_t *v;

    json_object_foreach(result, key, v) {
        if (!json_is_string(v) || json_string_length(v) < SF_CLAIM_MIN)
            continue;
        if (!br && !(br = calloc(1, sizeof(*br))))
            break;
        if (sf_claims_add(&br->claims, key) < 0) {
            br->down = 1; /* a field name claims cannot carry: never in our results */
            break;
        }
    }
    if (!br) {
        sf_buf b;
        int rc;

        sf_buf_init(&b, SF_MSG_MAX);
        rc = sf_jobio_encode_result(&c->job, result, NULL, &b);
        json_decref(result);
        reply_send(c, &b, rc);
        return;
    }
    br->c = c;
    br->result = result;
    for (int i = 0; i < br->claims.n && !br->down; i++) {
        json_t *s = json_object_get(result, br->claims.name[i]);
        br->pending++;
        if (sf_claim_put(c->ctx->redis, c->job.team, c->job.id, 1, br->claims.name[i],
                         json_string_value(s), json_string_length(s),
                         c->ctx->cfg.claim_team_mib << 20, on_claim_put, br) < 0) {
            br->pending--;
            br->down = 1;
        }
    }
    if (br->pending == 0)
        big_reply_finish(br);
}

void wk_event(wk_ctx *ctx, const char *type, const char *team, const char *sandbox,
              const json_t *extra)
{
    int rc = sf_event_emit(ctx->producer, type, team, sandbox, ctx->host_id, extra);

    if (rc < 0)
        sf_warn("msg=\"lifecycle event not sent\" type=%s sandbox=%s rc=%d", type, sandbox, rc);
}

/* For writes nobody waits on: an error is logged, nothing else. */
void wk_redis_logged(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"redis write failed\" err=\"%s\"", rep->str);
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
    wk_life_touch(ctx, id);
}

static void record_retire(wk_ctx *ctx, const char *id, const char *state, int only_live)
{
    if (sf_records_retire(ctx->redis, id, state, only_live, wk_redis_logged, NULL) < 0)
        sf_warn("msg=\"cannot update the record; Redis is down\" sandbox=%s state=%s", id, state);
}

/* A job answered without being run: a create that never ran leaves no record behind. */
static void refuse(wk_call *c, const char *code, const char *message)
{
    if (!strcmp(c->job.tool, "sandbox_create"))
        record_retire(c->ctx, c->job.sandbox, "failed", 0);
    wk_reply_error(c, code, message);
}

/* A job not signed by the scheduler for this host (hostauth.c): dead-lettered and answered
 * `unauthenticated` (an internal one never is), before any guard, record or sandbox. */
static void refuse_forged(wk_call *c, const char *text)
{
    int answer = !(c->tool && c->tool->internal) && c->job.reply[0];
    sf_buf b;

    sf_warn("msg=\"host job refused\" job=%s tool=%s key=%s why=\"%s\"", c->job.id, c->job.tool,
            c->job.auth.key, text);
    sf_buf_init(&b, SF_MSG_MAX);
    if (sf_job_encode(&c->job, &b) == 0)
        sf_kafka_produce(c->ctx->producer, SF_TOPIC_DEAD, "unauthenticated", b.p, b.len);
    sf_buf_reset(&b);
    if (answer && sf_jobio_encode_error(&c->job, SF_ERR_UNAUTH, text, &b) == 0)
        call_answer(c, b.p, b.len); /* ends the call, sent or not */
    else
        call_done(c);
    sf_buf_fini(&b);
}

/* A job for a sandbox this worker does not hold: the record says why (killed moments
 * ago: its teardown just ended; or lost: the worker restarted since). */
static void on_not_here_state(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    const char *st = rep && rep->type == REDIS_REPLY_STRING ? rep->str : "";
    char text[256];

    if (!strcmp(st, "killed") || !strcmp(st, "killing")) {
        if (!strcmp(st, "killing"))
            record_retire(c->ctx, c->job.sandbox, "killed", 1);
        snprintf(text, sizeof(text),
                 "Sandbox '%s' was killed; create a new one with sandbox_create.", c->job.sandbox);
    } else if (!strcmp(st, "failed")) {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' failed to start; create a new one with sandbox_create.",
                 c->job.sandbox);
    } else {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' is no longer running on its host (it was lost); create a new one "
                 "with sandbox_create.", c->job.sandbox);
        record_retire(c->ctx, c->job.sandbox, "lost", 1);
    }
    wk_reply_error(c, SF_ERR_NOT_FOUND, text);
}

static void not_here(wk_call *c)
{
    if (sf_redis_cmd(c->ctx->redis, on_not_here_state, c, "HGET " SF_RK_SANDBOX " state",
                     c->job.sandbox) < 0)
        wk_reply_error(c, SF_ERR_UNAVAILABLE,
                    "The platform's state store is unreachable; retry in a few seconds.");
}

static void box_release(wk_box *b)
{
    wk_ctx *ctx = b->ctx;

    sf_map_del(ctx->sandboxes, b->id);
    ctx->used_mem_mib -= b->lim.memory_mib;
    ctx->used_vcpu_milli -= b->lim.vcpu_milli;
    ctx->used_disk_mib -= b->lim.disk_mib;
    atomic_store(&ctx->beat.running, (int)sf_map_len(ctx->sandboxes));
    json_decref(b->env);
    wk_egress_box_free(b->eg);
    free(b);
}

static void on_killed(void *arg, int rc)
{
    wk_box *b = arg;

    record_retire(b->ctx, b->id, b->end_state, 0);
    wk_event(b->ctx, b->end_state, b->team, b->id, NULL);
    sf_info("msg=\"sandbox gone\" sandbox=%s state=%s teardown_rc=%d", b->id, b->end_state, rc);
    box_release(b);
}

void wk_box_kill(wk_box *b, const char *end_state)
{
    wk_box_kill_then(b, end_state, NULL, NULL);
}

int wk_box_kill_then(wk_box *b, const char *end_state, redisCallbackFn *written, void *priv)
{
    wk_ctx *ctx = b->ctx;
    int rc;

    if (b->state == WK_BOX_KILLING)
        return -EALREADY;
    b->end_state = end_state;
    rc = sf_records_mark_killing(ctx->redis, b->id, written ? written : wk_redis_logged,
                                 written ? priv : NULL);
    if (rc < 0)
        sf_warn("msg=\"cannot mark the record killing; Redis is down\" sandbox=%s", b->id);
    wk_egress_detach(ctx->egress, b); /* its listeners and placeholders go at once */
    if (b->state == WK_BOX_CREATING) {
        b->state = WK_BOX_KILLING; /* on_created kills it when the driver answers */
        return rc;
    }
    b->state = WK_BOX_KILLING;
    ctx->ops->kill(b->sb, on_killed, b);
    return rc;
}

static json_t *create_result(const wk_box *b, const char *name)
{
    return json_pack("{s:s, s:s, s:s}", "id", b->id, "name", name ? name : "", "status", "active");
}

/* The record says running (or Redis could not be asked: the sandbox runs, the periodic
 * check reconciles): the create is answered ok. A record that is no longer live (the
 * platform gave the sandbox up while it started: lost with its host's restart, or killed)
 * would leave an orphan: the sandbox goes and the create is answered with why. */
static void on_started(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    wk_ctx *ctx = c->ctx;
    wk_box *b = sf_map_get(ctx->sandboxes, c->job.sandbox);
    const char *name = json_string_value(json_object_get(c->job.args, "name"));

    if (!b || b->state != WK_BOX_RUNNING ||
        (rep && rep->type == REDIS_REPLY_INTEGER && rep->integer <= 0)) {
        sf_warn("msg=\"sandbox given up while it started; removing it\" sandbox=%s job=%s",
                c->job.sandbox, c->job.id);
        if (b && b->state == WK_BOX_RUNNING)
            wk_box_kill(b, "failed");
        wk_reply_error(c, SF_ERR_UNAVAILABLE, "The sandbox was given up while it started (its host "
                                           "restarted, or it was killed); create a new one.");
        return;
    }
    if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"redis write failed\" err=\"%s\"", rep->str);
    {
        json_t *x = json_pack("{s:s, s:i, s:i, s:i, s:i}", "driver", ctx->ops->name,
                              "memory_mib", (json_int_t)b->lim.memory_mib, "vcpu_milli",
                              (json_int_t)b->lim.vcpu_milli, "disk_mib",
                              (json_int_t)b->lim.disk_mib, "pids_max", (json_int_t)b->lim.pids_max);
        wk_event(ctx, "created", b->team, b->id, x);
        json_decref(x);
    }
    wk_life_started(b, c->job.args);
    sf_info("msg=\"sandbox created\" sandbox=%s team=%s job=%s", b->id, b->team, c->job.id);
    wk_reply_result(c, create_result(b, name));
}

/* The sandbox runs (and its egress is registered): it is answered as created. */
static void started(wk_box *b)
{
    wk_ctx *ctx = b->ctx;
    wk_call *c = b->create;
    char mem[24], pids[24], vcpu[24], disk[24];
    const char *kv[10 + 8];
    size_t n = 0;

    b->create = NULL;
    b->state = WK_BOX_RUNNING;
    ctx->ops->limits(b->sb, &b->lim); /* what the driver applied: the same, defaults filled in */
    snprintf(mem, sizeof(mem), "%u", b->lim.memory_mib);
    snprintf(vcpu, sizeof(vcpu), "%u", b->lim.vcpu_milli);
    snprintf(disk, sizeof(disk), "%u", b->lim.disk_mib);
    snprintf(pids, sizeof(pids), "%u", b->lim.pids_max);
    kv[n++] = "driver";
    kv[n++] = ctx->ops->name;
    kv[n++] = "memory_mib";
    kv[n++] = mem;
    kv[n++] = "vcpu_milli";
    kv[n++] = vcpu;
    kv[n++] = "disk_mib";
    kv[n++] = disk;
    kv[n++] = "pids_max";
    kv[n++] = pids;
    n += wk_egress_record_kv(b->eg, kv + n);
    /* state=running and back in its sets, only while the record is live (lands even
     * when Redis is full, never re-creates a record that is gone); answered then */
    if (sf_records_started(ctx->redis, b->id, ctx->host_id, n, kv, on_started, c) < 0)
        on_started(NULL, NULL, c);
}

/* A create that ended before the sandbox was answered as running: killed meanwhile
 * (that kill was answered), the worker stopping, or its egress refused. */
static int create_cut_short(wk_box *b)
{
    wk_ctx *ctx = b->ctx;
    wk_call *c = b->create;
    int was_killed = b->state == WK_BOX_KILLING;

    if (!was_killed && !ctx->stopping)
        return 0;
    b->create = NULL;
    b->state = WK_BOX_RUNNING;
    wk_box_kill(b, was_killed ? b->end_state : "failed");
    if (was_killed)
        wk_reply_error(c, SF_ERR_NOT_FOUND, "The sandbox was killed while it was starting; "
                                         "create a new one with sandbox_create.");
    else
        wk_reply_error(c, SF_ERR_UNAVAILABLE, "This host is shutting down; retry in a few seconds.");
    return 1;
}

typedef struct svc_failed {
    wk_call *c;
    const char *code;
    char text[2400];
} svc_failed;

static void on_svc_failed_written(redisAsyncContext *ac, void *r, void *priv)
{
    svc_failed *f = priv;

    wk_redis_logged(ac, r, NULL);
    wk_reply_error(f->c, f->code, f->text);
    free(f);
}

/* The template's service came up (or failed: the sandbox goes, and once its record says
 * so the create says why). */
static void on_service(wk_box *b, int rc, const char *why)
{
    wk_call *c = b->create;
    svc_failed *f;

    if (create_cut_short(b))
        return;
    if (rc < 0) {
        sf_info("msg=\"create failed: template service\" sandbox=%s rc=%d", b->id, rc);
        b->create = NULL;
        b->state = WK_BOX_RUNNING;
        if (!(f = calloc(1, sizeof(*f)))) {
            wk_box_kill(b, "failed");
            wk_reply_error(c, SF_ERR_INTERNAL, "The host is out of memory; retry later.");
            return;
        }
        f->c = c;
        f->code = rc == -ETIMEDOUT ? SF_ERR_INVALID : SF_ERR_UNAVAILABLE;
        snprintf(f->text, sizeof(f->text), "The sandbox's template did not start its service: "
                 "%s. The sandbox was removed; fix the template's start_cmd or ready_cmd "
                 "(delete it and build it again), or create from another template.",
                 why ? why : "no reason");
        if (wk_box_kill_then(b, "failed", on_svc_failed_written, f) < 0)
            on_svc_failed_written(NULL, NULL, f);
        return;
    }
    started(b);
}

/* The driver and the egress are ready: the template's service (tpl_start.h), if it has
 * one, then the create is answered. */
static void service_then_started(wk_box *b)
{
    int rc = wk_tpl_start_box(b, on_service);

    if (rc == 1)
        started(b); /* its template has none */
    else if (rc < 0)
        on_service(b, rc, "the host is out of memory; retry in a few seconds");
}

static void on_egress_ready(wk_box *b, int rc, const char *code, const char *why)
{
    wk_call *c = b->create;

    if (create_cut_short(b))
        return;
    if (rc < 0) {
        sf_info("msg=\"create refused by its egress\" sandbox=%s why=\"%s\"", b->id, why);
        b->create = NULL;
        b->state = WK_BOX_RUNNING;
        wk_box_kill(b, "failed");
        wk_reply_error(c, code, why);
        return;
    }
    service_then_started(b);
}

static void on_created(void *arg, wk_sandbox *sb, int rc, const char *why)
{
    wk_box *b = arg;
    wk_ctx *ctx = b->ctx;
    wk_call *c = b->create;

    wk_snap_unuse(ctx, b->snap_used);

    if (rc < 0) {
        char text[512];
        b->create = NULL;
        snprintf(text, sizeof(text), "The sandbox could not be started (%s); retry "
                 "sandbox_create, and tell the operator if it keeps failing.",
                 why ? why : "driver error");
        record_retire(ctx, b->id, "failed", 0);
        wk_event(ctx, "failed", b->team, b->id, NULL);
        box_release(b);
        wk_reply_error(c, SF_ERR_INTERNAL, text);
        return;
    }
    b->sb = sb;
    if (create_cut_short(b))
        return;
    if (b->eg) { /* its way out first: then the create is answered (state stays creating) */
        wk_egress_attach(ctx->egress, b, on_egress_ready);
        return;
    }
    service_then_started(b);
}

/* args.limits (set by the scheduler, CONTRACTS.md): missing fields take the worker's
 * defaults. -1 with why when a field is not a positive integer in range. */
static int parse_limits(const wk_ctx *ctx, const json_t *l, wk_limits *out, const char **why)
{
    static const struct {
        const char *name;
        json_int_t max;
    } f[] = {
        {"memory_mib", 1 << 22}, {"vcpu_milli", 1000000}, {"disk_mib", 1 << 24},
        {"pids_max", 4000000},   {"inodes", (json_int_t)1 << 32},
    };
    json_int_t v[SF_ARRAY_LEN(f)] = {ctx->cfg.memory_mib, ctx->cfg.vcpu_milli, ctx->cfg.disk_mib,
                                     ctx->cfg.pids_max, ctx->cfg.inodes};

    if (l && !json_is_object(l)) {
        *why = "args.limits must be an object (set by the scheduler).";
        return -1;
    }
    for (size_t i = 0; l && i < SF_ARRAY_LEN(f); i++) {
        json_t *j = json_object_get(l, f[i].name);
        if (!j)
            continue;
        if (!json_is_integer(j) || json_integer_value(j) < 1 || json_integer_value(j) > f[i].max) {
            *why = "args.limits has a field that is not a positive integer in range (set by the "
                   "scheduler); ask the operator to check its sandbox shapes.";
            return -1;
        }
        v[i] = json_integer_value(j);
    }
    out->memory_mib = (uint32_t)v[0];
    out->vcpu_milli = (uint32_t)v[1];
    out->disk_mib = (uint32_t)v[2];
    out->pids_max = (uint32_t)v[3];
    out->inodes = (uint64_t)v[4];
    return 0;
}

/* Which resource a sandbox of these limits would overfill beside what the host
 * holds already (starting, running and dying sandboxes), or NULL. */
static const char *no_room(const wk_ctx *ctx, const wk_limits *l)
{
    if ((int64_t)sf_map_len(ctx->sandboxes) >= ctx->capacity)
        return "sandboxes";
    if (ctx->used_mem_mib + l->memory_mib > ctx->res.mem_mib)
        return "memory";
    if (ctx->used_vcpu_milli + l->vcpu_milli > ctx->res.vcpu_milli)
        return "cpu";
    if (ctx->used_disk_mib + ctx->snap_disk_mib + l->disk_mib > ctx->res.disk_mib)
        return "disk"; /* (the snapshots stored here take their part: snapshot.c) */
    return NULL;
}

/* The layers of the create's template on this host (tstore.h); -1 when c was answered. */
static int template_layers(wk_call *c, char *layers[WK_LAYERS_MAX + 1])
{
    const char *name = json_string_value(json_object_get(c->job.args, "from_template"));
    char text[384];
    int rc;

    if (!name || !strcmp(name, "base"))
        return 0;
    if (!(c->ctx->ops->caps & WK_CAP_TEAMS) && strcmp(name, "debian") != 0) {
        snprintf(text, sizeof(text), "This host's %s driver runs only the 'base' and 'debian' "
                 "templates; create from one of them, or ask the operator for a jail host.",
                 c->ctx->ops->name);
        refuse(c, SF_ERR_INVALID, text);
        return -1;
    }
    rc = wk_tstore_layers(c->ctx->tstore, c->job.team, name, layers, text, sizeof(text));
    if (rc < 0) {
        refuse(c, rc == -EAGAIN ? SF_ERR_UNAVAILABLE : SF_ERR_NOT_FOUND, text);
        return -1;
    }
    return 0;
}

static void do_create(wk_call *c)
{
    wk_ctx *ctx = c->ctx;
    json_t *a = c->job.args, *env = json_object_get(a, "env_vars");
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *why = NULL, *full, *code = NULL;
    char text[256];
    wk_create_req req = {0};
    char *layers[WK_LAYERS_MAX + 1] = {NULL};
    wk_egbox *eg = NULL;
    char snap_dir[4200];
    const char *snap_id = NULL;
    wk_box *b;
    int rc;

    if ((b = sf_map_get(ctx->sandboxes, c->job.sandbox))) { /* redelivered: it exists already */
        if (strcmp(b->team, c->job.team) != 0 || b->state != WK_BOX_RUNNING) {
            wk_reply_error(c, SF_ERR_INVALID, "A sandbox with that id exists; let the platform "
                                           "choose the id of a new sandbox.");
            return;
        }
        wk_reply_result(c, create_result(b, name));
        return;
    }
    if (parse_limits(ctx, json_object_get(a, "limits"), &req.limits, &why) < 0) {
        refuse(c, SF_ERR_INVALID, why);
        return;
    }
    if ((rc = template_layers(c, layers)) < 0)
        return;
    req.template = json_string_value(json_object_get(a, "from_template"));
    snap_id = json_string_value(json_object_get(a, "snapshot_id")); /* from_snapshot */
    if (snap_id && wk_snap_use(ctx, snap_id, snap_dir, sizeof(snap_dir), &why) < 0) {
        wk_tstore_layers_free(layers);
        refuse(c, SF_ERR_NOT_FOUND, why);
        return;
    }
    req.snapshot = snap_id ? snap_dir : NULL;
    req.layers = layers[0] ? (const char *const *)layers : NULL;
    if (wk_egress_box_new(ctx->egress, a, &eg, &code, &why) < 0) {
        wk_tstore_layers_free(layers);
        wk_snap_unuse(ctx, snap_id);
        refuse(c, code, why);
        return;
    }
    if ((full = no_room(ctx, &req.limits))) {
        wk_tstore_layers_free(layers);
        wk_egress_box_free(eg);
        wk_snap_unuse(ctx, snap_id);
        sf_info("msg=\"create refused: host full\" sandbox=%s resource=%s", c->job.sandbox, full);
        refuse(c, SF_ERR_UNAVAILABLE,
               "The chosen host is at capacity; retry sandbox_create in a few seconds.");
        return;
    }
    if (!(b = calloc(1, sizeof(*b)))) {
        wk_tstore_layers_free(layers);
        wk_egress_box_free(eg);
        wk_snap_unuse(ctx, snap_id);
        refuse(c, SF_ERR_INTERNAL, "The host is out of memory; retry later.");
        return;
    }
    b->ctx = ctx;
    b->eg = eg;
    b->state = WK_BOX_CREATING;
    b->lim = req.limits;
    b->create = c;
    snprintf(b->id, sizeof(b->id), "%s", c->job.sandbox);
    snprintf(b->team, sizeof(b->team), "%s", c->job.team);
    snprintf(b->template_name, sizeof(b->template_name), "%s", req.template ? req.template : "base");
    snprintf(b->snap_used, sizeof(b->snap_used), "%s", snap_id ? snap_id : "");
    b->env = json_is_object(env) ? json_incref(env) : NULL;
    if (sf_map_put(ctx->sandboxes, b->id, b) < 0) {
        wk_snap_unuse(ctx, snap_id);
        wk_tstore_layers_free(layers);
        json_decref(b->env);
        wk_egress_box_free(b->eg);
        free(b);
        refuse(c, SF_ERR_UNAVAILABLE,
               "The chosen host is at capacity; retry sandbox_create in a few seconds.");
        return;
    }
    ctx->used_mem_mib += b->lim.memory_mib;
    ctx->used_vcpu_milli += b->lim.vcpu_milli;
    ctx->used_disk_mib += b->lim.disk_mib;
    atomic_store(&ctx->beat.running, (int)sf_map_len(ctx->sandboxes));
    req.id = b->id;
    req.trust_pem = wk_egress_trust_pem(ctx->egress, b->eg);
    rc = ctx->ops->create(ctx->drv, &req, on_created, b); /* the driver copies the layers */
    wk_tstore_layers_free(layers);
    if (rc < 0) {
        b->create = NULL;
        box_release(b);
        wk_snap_unuse(ctx, snap_id);
        if (snap_id && (rc == -ESTALE || rc == -ENOENT)) {
            refuse(c, SF_ERR_NOT_FOUND, "The snapshot no longer fits this host (its files are "
                   "gone, or its template was rebuilt since); delete it with "
                   "sandbox_snapshot_delete and take a new one.");
            return;
        }
        if (rc == -ENOTSUP) {
            snprintf(text, sizeof(text), "This host's %s driver runs only the 'base' and "
                     "'debian' templates; create from one of them, or ask the operator for a "
                     "jail host.", ctx->ops->name);
            refuse(c, SF_ERR_INVALID, text);
            return;
        }
        refuse(c, rc == -EINVAL ? SF_ERR_INVALID : SF_ERR_INTERNAL,
               rc == -EINVAL ? "The sandbox's limits are out of range for this host; ask the "
                               "operator to check the scheduler's sandbox shapes."
                             : "The host could not start a sandbox now; retry sandbox_create in "
                               "a few seconds.");
    }
}

/* Output text for JSON: valid UTF-8, with a marker where the middle was cut. */
static json_t *stream_text(const char *p, size_t len, uint64_t total)
{
    char *clean;
    size_t clen;
    json_t *s;

    if (total > len) {
        char mark[96];
        sf_buf b;
        size_t head = len / 2;
        int n = snprintf(mark, sizeof(mark), "\n[... %llu bytes omitted ...]\n",
                         (unsigned long long)(total - len));
        sf_buf_init(&b, len + sizeof(mark));
        sf_buf_append(&b, p, head);
        sf_buf_append(&b, mark, (size_t)n);
        sf_buf_append(&b, p + head, len - head);
        clean = sf_utf8_clean(b.p ? b.p : "", b.len, &clen);
        sf_buf_fini(&b);
    } else {
        clean = sf_utf8_clean(p ? p : "", len, &clen);
    }
    s = clean ? json_stringn(clean, clen) : json_string("");
    free(clean);
    return s;
}

/* A chunk of a streamed exec's output (the agent bounds their rate and size): one
 * `progress` reply (CONTRACTS.md), for callers that asked for progress. */
static void on_exec_output(void *arg, int stream, const char *data, size_t len)
{
    wk_call *c = arg;
    size_t n = 0;
    char *text;
    json_t *chunk;

    if (c->cancelled || !(text = sf_utf8_clean(data, len, &n)))
        return;
    chunk = json_pack("{s:s, s:s%}", "stream", stream == 1 ? "stderr" : "stdout", "data", text, n);
    if (chunk && sf_jobio_progress(c->ctx->producer, &c->job, chunk) < 0)
        sf_debug("msg=\"cannot produce a progress reply\" job=%s", c->job.id);
    json_decref(chunk);
    free(text);
}

static void on_exec_done(void *arg, const wk_exec_result *res)
{
    wk_call *c = arg;
    json_t *r;

    SF_TRACE(c->job.id, "exit", res->error ? -1 : (int64_t)res->duration_ms);
    sf_map_del(c->ctx->running, c->job.id);
    if (c->cancelled) { /* its caller left: the one final reply, which nobody shows */
        sf_info("msg=\"exec cancelled\" job=%s sandbox=%s", c->job.id, c->job.sandbox);
        wk_reply_error(c, SF_ERR_CANCELLED, "The call was cancelled by its caller.");
        return;
    }
    if (res->error) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, res->error);
        return;
    }
    if (res->pid) { /* background: it runs on, its output in its log */
        wk_touch(c->ctx, c->job.sandbox);
        wk_reply_result(c, json_pack("{s:I, s:b, s:s, s:s, s:i, s:s}", "pid",
                                     (json_int_t)res->pid, "background", 1, "stdout", "",
                                     "stderr", "", "exit_code", 0, "log",
                                     "sandbox_process_logs"));
        return;
    }
    r = json_object();
    json_object_set_new(r, "stdout", stream_text(res->out, res->out_len, res->out_total));
    json_object_set_new(r, "stderr", stream_text(res->err, res->err_len, res->err_total));
    if (res->oom_killed) {
        wk_box *b = sf_map_get(c->ctx->sandboxes, c->job.sandbox);
        char note[256];
        snprintf(note, sizeof(note), "%s[sandfleet] The sandbox reached its memory limit (%u MiB) "
                 "and the kernel killed a process of this command; use less memory.\n",
                 json_string_length(json_object_get(r, "stderr")) ? "\n" : "",
                 b ? b->lim.memory_mib : 0);
        json_object_set_new(r, "stderr", json_sprintf("%s%s",
                            json_string_value(json_object_get(r, "stderr")), note));
    }
    json_object_set_new(r, "exit_code", json_integer(res->exit_code));
    json_object_set_new(r, "truncated", json_boolean(res->truncated));
    json_object_set_new(r, "stdout_bytes", json_integer((json_int_t)res->out_total));
    json_object_set_new(r, "stderr_bytes", json_integer((json_int_t)res->err_total));
    json_object_set_new(r, "timed_out", json_boolean(res->timed_out));
    json_object_set_new(r, "duration_ms", json_integer(res->duration_ms));
    if (res->oom_killed)
        json_object_set_new(r, "oom_killed", json_true());
    wk_touch(c->ctx, c->job.sandbox);
    sf_debug("msg=\"exec done\" job=%s sandbox=%s exit=%d ms=%u", c->job.id, c->job.sandbox,
             res->exit_code, res->duration_ms);
    wk_reply_result(c, r);
}

/* Appends "K=V" strings of obj to env (owned copies in *store). */
static int env_add(json_t *obj, const char **env, size_t *n, char **store)
{
    const char *k;
    json_t *v;

    json_object_foreach(obj, k, v) {
        char *kv;
        if (!json_is_string(v))
            continue;
        if (*n >= EXEC_ENV_MAX || asprintf(&kv, "%s=%s", k, json_string_value(v)) < 0)
            return -1;
        store[*n] = kv;
        env[(*n)++] = kv;
    }
    return 0;
}

/* background and stdin (issue 20); -1 (answered) when stdin is unusable. */
static int exec_extras(wk_call *c, wk_exec_req *req)
{
    json_t *in = json_object_get(c->job.args, "stdin");

    req->background = json_is_true(json_object_get(c->job.args, "background"));
    if (!in)
        return 0;
    if (!json_is_string(in) || json_string_length(in) > WK_EXEC_STDIN_MAX) {
        wk_reply_error(c, SF_ERR_INVALID, "Argument 'stdin' must be a UTF-8 string of at most "
                                          "8 MiB; pass larger input through a file "
                                          "(sandbox_files_write, then `cmd < file`).");
        return -1;
    }
    req->has_stdin = 1;
    req->stdin_data = json_string_value(in);
    req->stdin_len = json_string_length(in);
    return 0;
}

static void do_exec(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args, *all = json_object();
    const char *env[EXEC_ENV_MAX + 1];
    char *store[EXEC_ENV_MAX];
    size_t n = 0;
    int64_t timeout = sf_exec_timeout_ms(a);
    int64_t left = c->job.deadline_ms - sf_now_ms() - 200; /* the caller stops waiting then */
    wk_exec_req req = {0};
    int rc;

    if (timeout > left)
        timeout = left > 1 ? left : 1;
    /* one value per name: env_vars, then the egress variables (proxy, CA, placeholders),
     * then the call's own env */
    if (b->env)
        json_object_update(all, b->env);
    if (b->eg)
        json_object_update(all, wk_egress_env(b->eg));
    if (json_is_object(json_object_get(a, "env")))
        json_object_update(all, json_object_get(a, "env"));
    if (!all || env_add(all, env, &n, store) < 0) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        json_decref(all);
        wk_reply_error(c, SF_ERR_INVALID, "Too many environment variables; pass at most 256.");
        return;
    }
    json_decref(all);
    env[n] = NULL;
    req.command = json_string_value(json_object_get(a, "command"));
    req.cwd = json_string_value(json_object_get(a, "cwd"));
    req.env = env;
    req.timeout_ms = (uint32_t)timeout;
    req.cap_bytes = EXEC_CAP_BYTES;
    if (c->job.progress)
        req.on_output = on_exec_output;
    if (exec_extras(c, &req) < 0) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        return;
    }
    if (!req.command) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        wk_reply_error(c, SF_ERR_INVALID, "Argument 'command' is required.");
        return;
    }
    SF_TRACE(c->job.id, "exec", 0);
    rc = c->ctx->ops->exec(b->sb, &req, on_exec_done, c);
    if (rc == 0 && sf_map_put(c->ctx->running, c->job.id, c) < 0)
        sf_warn("msg=\"exec cannot be cancelled (out of memory)\" job=%s", c->job.id);
    for (size_t i = 0; i < n; i++)
        free(store[i]);
    if (rc == -EBUSY)
        wk_reply_error(c, SF_ERR_LIMIT, "64 commands are already running in this sandbox; wait for "
                                     "some to finish, then retry.");
    else if (rc == -E2BIG)
        wk_reply_error(c, SF_ERR_INVALID, "The command and its environment are too large (the limit "
                                       "is 1 MiB); write a script with a file and run that.");
    else if (rc == -EINVAL)
        wk_reply_error(c, SF_ERR_INVALID, "The command, cwd or environment could not be sent (too "
                                       "long, or containing NUL bytes); shorten them.");
    else if (rc == -ESRCH)
        wk_reply_error(c, SF_ERR_NOT_FOUND, "The sandbox is being killed; create a new one with "
                                         "sandbox_create.");
    else if (rc < 0)
        wk_reply_error(c, SF_ERR_UNAVAILABLE,
                    "The sandbox did not accept the command; retry, or create a new sandbox.");
}

static void kill_answer(wk_call *c)
{
    wk_reply_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "killed"));
}

static void on_kill_written(redisAsyncContext *ac, void *r, void *priv)
{
    wk_redis_logged(ac, r, NULL);
    kill_answer(priv);
}

/* Answered as soon as the record says `killing` (or `killed`, for a sandbox this host no
 * longer holds: b NULL), not when the teardown ends: a caller that lists its sandboxes
 * right after the answer no longer sees this one. The record's write is a read then a
 * script, so the answer waits for its callback rather than relying on Redis's order. */
static void do_kill(wk_call *c, wk_box *b)
{
    int rc;

    if (b)
        rc = wk_box_kill_then(b, "killed", on_kill_written, c);
    else if ((rc = sf_records_retire(c->ctx->redis, c->job.sandbox, "killed", 0,
                                     on_kill_written, c)) < 0)
        sf_warn("msg=\"cannot update the record; Redis is down\" sandbox=%s state=killed",
                c->job.sandbox);
    if (rc < 0)
        kill_answer(c); /* already being killed, or Redis is down: nothing to wait for */
}

/* ---- egress on a running sandbox: secret bindings (egress.h; rules: update.c) ---- */

static void reply_gone(wk_call *c)
{
    char text[256];

    snprintf(text, sizeof(text), "Sandbox '%s' was killed meanwhile; create a new one with "
             "sandbox_create.", c->job.sandbox);
    wk_reply_error(c, SF_ERR_NOT_FOUND, text);
}

static void on_bindings_changed(void *arg, wk_box *b, int rc, const char *code, const char *why)
{
    wk_call *c = arg;
    json_t *r;

    if (!b) {
        reply_gone(c);
        return;
    }
    if (rc < 0) {
        wk_reply_error(c, code, why);
        return;
    }
    /* names only: never a value, never the placeholder (the sandbox's env holds it) */
    r = json_pack("{s:s, s:O, s:O}", "sandbox_id", b->id, "env_key",
                  json_object_get(c->job.args, "env_key"), "secrets", wk_egress_secrets(b->eg));
    if (r && json_object_get(c->job.args, "secret_name"))
        json_object_set(r, "secret_name", json_object_get(c->job.args, "secret_name"));
    wk_reply_result(c, r);
}

/* The sandbox's bindings with env_key set to name (NULL: removed). */
static json_t *bindings_with(const wk_box *b, const char *env_key, const char *name)
{
    const json_t *cur = wk_egress_secrets(b->eg);
    json_t *s = cur ? json_deep_copy(cur) : json_object();

    if (s && name)
        json_object_set_new(s, env_key, json_string(name));
    else if (s)
        json_object_del(s, env_key);
    return s;
}

static void do_attach_secret(wk_call *c, wk_box *b)
{
    const char *key = json_string_value(json_object_get(c->job.args, "env_key"));
    const char *name = json_string_value(json_object_get(c->job.args, "secret_name"));
    json_t *s = bindings_with(b, key, name);

    if (!s) {
        wk_reply_error(c, SF_ERR_INTERNAL, "The host is out of memory; retry later.");
        return;
    }
    if (json_object_size(s) > WK_EGRESS_BINDINGS_MAX) {
        json_decref(s);
        wk_reply_error(c, SF_ERR_INVALID, "A sandbox holds at most 32 secret bindings; detach one "
                                       "with sandbox_detach_secret first.");
        return;
    }
    wk_egress_change(c->ctx->egress, b, NULL, NULL, s, on_bindings_changed, c);
    json_decref(s);
}

static void do_detach_secret(wk_call *c, wk_box *b)
{
    const char *key = json_string_value(json_object_get(c->job.args, "env_key"));
    const json_t *cur = wk_egress_secrets(b->eg);
    char text[256];
    json_t *s;

    if (!cur || !json_object_get(cur, key)) {
        snprintf(text, sizeof(text), "No secret is bound to %s in sandbox '%s'; sandbox_info "
                 "lists its bindings.", key, b->id);
        wk_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!(s = bindings_with(b, key, NULL))) {
        wk_reply_error(c, SF_ERR_INTERNAL, "The host is out of memory; retry later.");
        return;
    }
    wk_egress_change(c->ctx->egress, b, NULL, NULL, s, on_bindings_changed, c);
    json_decref(s);
}

/* The tools that run here (x-sandfleet.runs = worker). A handler gets the call and the
 * sandbox: running for tools on an existing sandbox (except sandbox_kill, which also gets
 * sandboxes being created or killed, and NULL); NULL for the others. */
typedef void (*wk_handler)(wk_call *c, wk_box *b);
static void create_handler(wk_call *c, wk_box *b)
{
    do_create(c);
}
#define H(name, fn) {name, (void (*)(void))(fn)}
static const sf_tool_handler handlers[] = {
    H("sandbox_create", create_handler),
    H("sandbox_kill", do_kill),
    H("sandbox_exec", do_exec),
    H("sandbox_update", wk_do_update),
    H("sandbox_attach_secret", do_attach_secret),
    H("sandbox_detach_secret", do_detach_secret),
    H("sandbox_files_read", wk_files_read),
    H("sandbox_files_write", wk_files_write),
    H("sandbox_files_list", wk_files_list),
    H("sandbox_files_download_dir", wk_files_download),
    H("sandbox_process_list", wk_procs_list),
    H("sandbox_process_kill", wk_procs_kill),
    H("sandbox_process_logs", wk_procs_logs),
    H("sandbox_pause", wk_do_pause),
    H("sandbox_resume", wk_do_resume),
    H("sandbox_snapshot", wk_do_snapshot),
};
#undef H

/* What this worker must handle: the tools that run on a sandbox's host, and the host's half
 * of the tools that make a sandbox (placed by the scheduler, started here). */
static int runs_here(const sf_tool *t)
{
    return !t->internal && (t->runs == SF_RUNS_WORKER || t->sandbox == SF_SB_NEW);
}

int wk_jobs_check(const sf_toolset *tools, char *why, size_t whylen)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(handlers); i++) {
        const sf_tool *t = sf_toolset_find(tools, handlers[i].name);
        if (!t || !runs_here(t)) {
            snprintf(why, whylen, "this worker handles %s, which the tool schemas do not declare "
                     "to run on a host; point schemas_dir at this build's schemas",
                     handlers[i].name);
            return -EINVAL;
        }
    }
    for (size_t i = 0; i < tools->n; i++)
        if (runs_here(&tools->tools[i]) &&
            !sf_tool_handler_find(handlers, SF_ARRAY_LEN(handlers), tools->tools[i].name)) {
            snprintf(why, whylen, "tool %s declares runs: worker, but this worker has no handler "
                     "for it; deploy the matching build of every daemon", tools->tools[i].name);
            return -EINVAL;
        }
    return 0;
}

static void on_auto_resumed(wk_call *c, int rc, const char *why);

static void resumed_for_cancel(wk_call *c, int rc, const char *why)
{
    (void)c;
    if (rc < 0)
        sf_warn("msg=\"a paused sandbox could not be resumed for a cancel\" rc=%d why=\"%s\"",
                rc, why ? why : "");
}

/* sf.cancel (CONTRACTS.md): the running command of job args.job, of the same team, is
 * killed; that job then gets its one final reply (cancelled). The cancel is never
 * answered. */
static void do_cancel(wk_call *c)
{
    const char *target = json_string_value(json_object_get(c->job.args, "job"));
    wk_call *x = target ? sf_map_get(c->ctx->running, target) : NULL;
    wk_box *b;

    if (x && !x->cancelled && !strcmp(x->job.team, c->job.team) &&
        (b = sf_map_get(c->ctx->sandboxes, x->job.sandbox)) && b->sb &&
        b->state == WK_BOX_RUNNING) {
        x->cancelled = 1;
        if (b->paused || b->pausing) /* a frozen agent cannot kill anything */
            wk_box_resume(b, NULL, resumed_for_cancel);
        if (c->ctx->ops->exec_cancel(b->sb, x) < 0)
            sf_debug("msg=\"nothing to cancel\" job=%s", target);
        sf_info("msg=\"cancelling a call\" job=%s cancel=%s", target, c->job.id);
    } else {
        sf_debug("msg=\"cancel of a call not running here\" job=%s", target ? target : "");
    }
    call_done(c);
}

static void dispatch(wk_call *c)
{
    wk_ctx *ctx = c->ctx;
    const sf_tool *t = c->tool;
    const sf_tool_handler *h = sf_tool_handler_find(handlers, SF_ARRAY_LEN(handlers), c->job.tool);
    char text[256];
    wk_box *b;

    if (t && t->internal) { /* sf.cancel, sf.template_build/_delete: never answered */
        if (!strcmp(c->job.tool, SF_TOOL_TEMPLATE_BUILD)) {
            wk_tpl_build(ctx, &c->job);
            call_done(c);
        } else if (!strcmp(c->job.tool, SF_TOOL_TEMPLATE_DELETE)) {
            wk_tpl_delete(ctx, &c->job);
            call_done(c);
        } else {
            do_cancel(c);
        }
        return;
    }
    if (!t || !h) {
        snprintf(text, sizeof(text), "Tool '%.64s' is not available on this host; retry after "
                 "the platform's upgrade finished.", c->job.tool);
        wk_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (t->sandbox != SF_SB_EXISTING) {
        ((wk_handler)h->fn)(c, NULL);
        return;
    }
    b = sf_map_get(ctx->sandboxes, c->job.sandbox);
    if (b && strcmp(b->team, c->job.team) != 0) { /* the scheduler checked: never happens */
        sf_warn("msg=\"job for another team's sandbox refused\" job=%s sandbox=%s team=%s",
                c->job.id, c->job.sandbox, c->job.team);
        wk_reply_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
        return;
    }
    if (!strcmp(c->job.tool, "sandbox_kill")) {
        do_kill(c, b);
        return;
    }
    if (!b) {
        not_here(c);
        return;
    }
    if (b->state == WK_BOX_KILLING) {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' was killed; create a new one with sandbox_create.", b->id);
        wk_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    if (b->state == WK_BOX_CREATING) {
        snprintf(text, sizeof(text), "Sandbox '%s' is still starting; retry in a moment.", b->id);
        wk_reply_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (t->resume && (b->paused || b->pausing)) { /* the call goes on once it runs again */
        int rc = wk_box_resume(b, c, on_auto_resumed);
        if (rc < 0)
            on_auto_resumed(c, rc, NULL);
        return;
    }
    if (!c->on_box) {
        c->on_box = 1;
        b->calls++;
    }
    ((wk_handler)h->fn)(c, b);
}

static void on_auto_resumed(wk_call *c, int rc, const char *why)
{
    char text[320];
    wk_box *bx;

    if (rc < 0) {
        snprintf(text, sizeof(text), "%s", why ? why : "The paused sandbox could not be "
                 "resumed; retry, or kill it and create a new one.");
        wk_reply_error(c, rc == -ESRCH ? SF_ERR_NOT_FOUND : SF_ERR_UNAVAILABLE, text);
        return;
    }
    if ((bx = sf_map_get(c->ctx->sandboxes, c->job.sandbox)) && (bx->paused || bx->pausing)) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, "The paused sandbox could not be resumed; retry, "
                       "or kill it and create a new one.");
        return;
    }
    dispatch(c); /* looks the sandbox up again */
}

/* ---- argument claims (sf_claim.h): taken before the handler runs ---- */

static void on_claim_taken(redisAsyncContext *ac, void *r, void *priv);

static void claims_done(wk_call *c)
{
    if (c->claims_failed) {
        wk_reply_error(c, SF_ERR_INVALID, "The large argument of this call is no longer "
                       "available (it expired, or the call was retried); send the call again.");
        return;
    }
    dispatch(c);
}

/* Takes each claimed argument, in the order the envelope names them. */
static void take_claims(wk_call *c)
{
    char text[160];

    for (int i = 0; i < c->job.claims.n; i++)
        if (!sf_tool_claimable(c->tool, c->job.claims.name[i])) {
            snprintf(text, sizeof(text), "Argument '%s' of %s cannot travel by claim check; "
                     "send it inline.", c->job.claims.name[i], c->job.tool);
            wk_reply_error(c, SF_ERR_INVALID, text);
            return;
        }
    for (int i = 0; i < c->job.claims.n; i++) {
        if (sf_claim_take(c->ctx->redis, c->job.team, c->job.id, 0, c->job.claims.name[i],
                          on_claim_taken, c) < 0) {
            c->claims_failed = 1;
            break;
        }
        c->claims_left++;
    }
    if (c->claims_left == 0)
        claims_done(c);
}

static void on_claim_taken(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    int i = c->job.claims.n - c->claims_left; /* answers come in the order asked */

    (void)ac;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        json_t *v = json_stringn(rep->str, rep->len);
        if (v)
            json_object_set_new(c->job.args, c->job.claims.name[i], v);
        else
            c->claims_failed = 1; /* not UTF-8: not what a gateway stores */
    } else {
        c->claims_failed = 1;
    }
    if (--c->claims_left == 0)
        claims_done(c);
}

#define MSG_OUTCOME_UNKNOWN                                                                   \
    "The command's outcome is unknown: its host failed while it ran; check the sandbox "     \
    "(sandbox_info, or look at what the command should have changed) before running it again."

static void on_guard(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r, *verdict;
    wk_call *c = priv;

    SF_TRACE(c->job.id, "guard", 0);
    if (sf_redis_is_oom(rep) && !strcmp(c->job.tool, "sandbox_kill")) {
        dispatch(c); /* Redis is full: a kill frees room, and runs twice harmlessly */
        return;
    }
    if (sf_redis_is_oom(rep)) {
        refuse(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        (verdict = rep->element[0])->type != REDIS_REPLY_STRING) {
        refuse(c, SF_ERR_UNAVAILABLE,
               "The platform's state store is unreachable; retry in a few seconds.");
        return;
    }
    if (!strcmp(verdict->str, "new") && c->job.deadline_ms < sf_now_ms()) {
        sf_info("msg=\"job expired in the queue\" job=%s tool=%s", c->job.id, c->job.tool);
        refuse(c, SF_ERR_TIMEOUT, "The call waited in the queue past its deadline; retry it.");
        return;
    }
    if (!strcmp(verdict->str, "new")) {
        take_claims(c);
        return;
    }
    if (!strcmp(verdict->str, "full")) {
        char text[400];
        snprintf(text, sizeof(text), MSG_GUARD_FULL, (long long)c->ctx->cfg.guard_team_mib);
        sf_info("msg=\"job refused: the team's kept answers fill guard_team_mib\" job=%s "
                "team=%s", c->job.id, c->job.team);
        refuse(c, SF_ERR_LIMIT, text);
        return;
    }
    if (!strcmp(verdict->str, "running")) { /* this process runs it and will answer */
        sf_info("msg=\"repeat of a running job: it answers when done\" job=%s", c->job.id);
        call_done(c);
        return;
    }
    if (!strcmp(verdict->str, "done") && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_STRING && rep->element[1]->len > 0) {
        sf_info("msg=\"repeat of a finished job: its answer again\" job=%s", c->job.id);
        call_answer(c, rep->element[1]->str, rep->element[1]->len);
        return;
    }
    if (!strcmp(verdict->str, "done")) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE,
                    "This call ran already, but its answer was too large to keep for a repeat; "
                    "check the sandbox before running it again.");
        return;
    }
    /* orphan: a worker process that is gone (this host before a restart) was running it */
    sf_info("msg=\"job was running when its worker died\" job=%s tool=%s", c->job.id,
            c->job.tool);
    wk_reply_error(c, SF_ERR_UNAVAILABLE, MSG_OUTCOME_UNKNOWN);
}

void wk_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why)
{
    sf_warn("msg=\"message rejected\" offset=%lld why=\"%s\"", (long long)msg->offset, why);
}

void wk_on_job(void *arg, sf_job *job, sf_kafka_ticket tk)
{
    wk_ctx *ctx = arg;
    wk_call *c = calloc(1, sizeof(*c));
    char key[3][160], ttl[24], now[24], budget[24], text[400];
    int64_t latest;
    int rc;

    if (!c) {
        sf_job_fini(job);
        sf_jobq_done(ctx->jobq, tk);
        return;
    }
    c->ctx = ctx;
    c->ticket = tk;
    c->job = *job;
    c->tool = sf_toolset_find(&ctx->tools, c->job.tool);
    if (wk_hostauth_check(ctx, &c->job, text, sizeof(text)) < 0) {
        refuse_forged(c, text);
        return;
    }
    /* a producer chooses its deadline: it bounds how long the guard (and its reply) is kept */
    latest = sf_now_ms() + ctx->cfg.job_deadline_max_ms;
    if (c->job.deadline_ms > latest)
        c->job.deadline_ms = latest;
    if (ctx->stopping) {
        refuse(c, SF_ERR_UNAVAILABLE, "This host is shutting down; retry in a few seconds.");
        return;
    }
    /* (a job past its deadline is refused after the guard: a repeat of a finished one
     * gets its answer again) */
    {
        const sf_tool *t = sf_toolset_find(&ctx->tools, c->job.tool);
        if (t && t->internal) { /* sf.cancel: no guard, never answered */
            dispatch(c);
            return;
        }
    }
    if (!instance[0] && sf_id_new(instance, "wi_") < 0) {
        refuse(c, SF_ERR_INTERNAL, "The host has no randomness; tell the operator.");
        return;
    }
    guard_keys(&c->job, key);
    snprintf(ttl, sizeof(ttl), "%ld", guard_ttl_s(&c->job));
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(budget, sizeof(budget), "%lld", (long long)(ctx->cfg.guard_team_mib << 20));
    {
        const char *argv[] = {key[0], key[1], key[2], ctx->host_id, instance, ttl,
                              c->job.reply, now, budget,
                              strcmp(c->job.tool, "sandbox_kill") ? "0" : "1"};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        rc = sf_redis_script_call(ctx->redis, &sf_store_guard_begin, on_guard, c, 3, 7, argv, lens);
    }
    if (rc < 0)
        refuse(c, SF_ERR_UNAVAILABLE,
               "The platform's state store is unreachable; retry in a few seconds.");
}
