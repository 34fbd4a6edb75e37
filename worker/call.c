/* call.c: the call module below every handler: a job's one reply (error or result, large
 * fields by claim check), the job guard that answers a repeat with its first answer, the
 * argument claims taken before the handler runs, and the handler registry each handler
 * file fills where it defines its tools (WK_HANDLERS, worker.h). It calls no handler and no
 * other file of the daemon. */
#include "worker.h"
#include "sf_claim.h"
#include "sf_events.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_tools.h"
#include "sf_trace.h"
#include "sf_msg.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

void wk_call_done(wk_call *c)
{
    sf_call_end(&c->call);
    call_free(c);
}

/* Sends a reply (sf_call: the first answer wins); its job's offset moves once Kafka
 * confirmed it. Ends the call. */
static int call_answer(wk_call *c, const void *p, size_t n)
{
    int rc = sf_call_answer(&c->call, p, n);

    if (rc < 0 && rc != -EALREADY)
        sf_error("msg=\"cannot produce reply\" job=%s rc=%d", c->job.id, rc);
    wk_call_done(c);
    return rc;
}

/* The job guard (sf:job:{id}, a hash; schemas/redis-keys.md) says where a job stands:
 * `running` on which worker process (host + instance), then `done` with its encoded reply,
 * kept until shortly after the job's deadline. A redelivered job (a restarted worker reads
 * its topic again from the last committed offset; a scheduler that died forwards again)
 * then gets its first answer again instead of a second run or silence. */
#define GUARD_REPLY_MAX (256 * 1024) /* larger replies are not kept for a repeat */

/* Its two scripts: sf_store_guard_begin, sf_store_guard_done (state/sf_store.c). */

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
        wk_call_done(c);
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
            snprintf(text, sizeof(text), SF_MSG_TEAM_FILES_FULL_FMT,
                     (long long)(ctx->cfg.claim_team_mib));
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

void wk_record_retire(wk_ctx *ctx, const char *id, const char *state, int only_live)
{
    if (sf_records_retire(ctx->redis, id, state, only_live, wk_redis_logged, NULL) < 0)
        sf_warn("msg=\"cannot update the record; Redis is down\" sandbox=%s state=%s", id, state);
}

/* A job answered without being run: a create that never ran leaves no record behind. */
void wk_call_refuse(wk_call *c, const char *code, const char *message)
{
    if (!strcmp(c->job.tool, "sandbox_create"))
        wk_record_retire(c->ctx, c->job.sandbox, "failed", 0);
    wk_reply_error(c, code, message);
}

/* A job not signed by the scheduler for this host (hostauth.c): dead-lettered and answered
 * `unauthenticated` (an internal one never is), before any guard, record or sandbox. */
void wk_call_refuse_forged(wk_call *c, const char *text)
{
    int answer = !(c->tool && c->tool->internal && !c->tool->answered) && c->job.reply[0];
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
        wk_call_done(c);
    sf_buf_fini(&b);
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
    c->run(c);
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
        c->run(c); /* Redis is full: a kill frees room, and runs twice harmlessly */
        return;
    }
    if (sf_redis_is_oom(rep)) {
        wk_call_refuse(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        (verdict = rep->element[0])->type != REDIS_REPLY_STRING) {
        wk_call_refuse(c, SF_ERR_UNAVAILABLE,
               SF_MSG_STORE_DOWN);
        return;
    }
    if (!strcmp(verdict->str, "new") && c->job.deadline_ms < sf_now_ms()) {
        sf_info("msg=\"job expired in the queue\" job=%s tool=%s", c->job.id, c->job.tool);
        wk_call_refuse(c, SF_ERR_TIMEOUT, SF_MSG_CALL_EXPIRED);
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
        wk_call_refuse(c, SF_ERR_LIMIT, text);
        return;
    }
    if (!strcmp(verdict->str, "running")) { /* this process runs it and will answer */
        sf_info("msg=\"repeat of a running job: it answers when done\" job=%s", c->job.id);
        wk_call_done(c);
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


/* ---- the job guard's first step: a new job runs, a repeat gets its answer ---- */

void wk_call_begin(wk_call *c, void (*run)(wk_call *c))
{
    wk_ctx *ctx = c->ctx;
    char key[3][160], ttl[24], now[24], budget[24];
    int rc;

    c->run = run;
    if (!instance[0] && sf_id_new(instance, "wi_") < 0) {
        wk_call_refuse(c, SF_ERR_INTERNAL, "The host has no randomness; tell the operator.");
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
        wk_call_refuse(c, SF_ERR_UNAVAILABLE,
                       SF_MSG_STORE_DOWN);
}

/* ---- the handler registry ---- */

static sf_tool_handler handlers[WK_HANDLERS_MAX];
static size_t n_handlers;
static int handlers_over; /* more than WK_HANDLERS_MAX registered: wk_jobs_check says so */

void wk_handlers_add(const wk_handler *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (n_handlers == WK_HANDLERS_MAX) {
            handlers_over = 1;
            return;
        }
        handlers[n_handlers].name = h[i].tool;
        handlers[n_handlers].fn = (void (*)(void))h[i].fn;
        n_handlers++;
    }
}

const sf_tool_handler *wk_handlers(size_t *n)
{
    *n = handlers_over ? 0 : n_handlers;
    return handlers_over ? NULL : handlers;
}

wk_handler_fn wk_handler_find(const char *tool)
{
    const sf_tool_handler *h = sf_tool_handler_find(handlers, n_handlers, tool);
    return h ? (wk_handler_fn)h->fn : NULL;
}
