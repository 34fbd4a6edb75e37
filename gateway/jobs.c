/* jobs.c: publishes jobs to sf.jobs and matches replies on this gateway's own reply
 * topic to the calls waiting for them; a call whose deadline passes is answered once,
 * with a timeout, and a late reply is dropped. */
#include "gateway.h"
#include "sf_claim.h"
#include "sf_trace.h"
#include "sf_jobauth.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct gw_pending {
    gw_ctx *ctx;
    struct event *timer;
    gw_job_cb cb;
    gw_progress_cb progress;
    void *arg;
    char id[SF_ID_MAX];
    char team[SF_ID_MAX];
    char sandbox[SF_ID_MAX];
    int fetching;       /* the reply's claims are being taken: no deadline, no map entry */
    int cancelled;      /* ...and its caller went away meanwhile */
    int keep_claims;    /* its answer may be asked for again: claims are read, not taken */
    size_t len;   /* the encoded job, kept to publish it again (0: too large to keep) */
    char *msg;
};

/* Jobs up to this size are kept while they wait, to publish them again when the broker
 * lost them (a restarted embedded broker keeps nothing); larger ones are answered at
 * their deadline then. */
#define KEEP_JOB_MAX (64 * 1024)

/* The key of the messages that probe whether Kafka takes messages again (never a reply). */
#define PROBE_KEY "sf-probe"

/* Per-team count of pending calls, for the whole process (every thread's instance):
 * +1 on submit, -1 when the call ends. */
struct gw_team_table {
    pthread_mutex_t mu;
    sf_map *map; /* team -> int * */
};

gw_team_table *gw_team_table_new(size_t max)
{
    gw_team_table *t = calloc(1, sizeof(*t));

    if (t && (!(t->map = sf_map_new(max)) || pthread_mutex_init(&t->mu, NULL) != 0)) {
        sf_map_free(t->map);
        free(t);
        t = NULL;
    }
    return t;
}

void gw_team_table_free(gw_team_table *t)
{
    if (!t)
        return;
    sf_map_free(t->map); /* empty: every pending call left its team */
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static int team_enter(gw_ctx *ctx, const char *team)
{
    gw_team_table *t = ctx->teams;
    int *n, rc = 0;

    pthread_mutex_lock(&t->mu);
    n = sf_map_get(t->map, team);
    if (n && *n >= ctx->cfg.max_pending_team) {
        rc = -EDQUOT;
    } else if (!n) {
        if (!(n = calloc(1, sizeof(*n))))
            rc = -ENOMEM;
        else if (sf_map_put(t->map, team, n) < 0) {
            free(n);
            n = NULL;
            rc = -E2BIG;
        }
    }
    if (rc == 0)
        (*n)++;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static void team_leave(gw_ctx *ctx, const char *team)
{
    gw_team_table *t = ctx->teams;
    int *n;

    pthread_mutex_lock(&t->mu);
    n = sf_map_get(t->map, team);
    if (n && --*n <= 0)
        free(sf_map_del(t->map, team));
    pthread_mutex_unlock(&t->mu);
}

static void pending_free(gw_pending *p)
{
    team_leave(p->ctx, p->team);
    free(p->msg);
    if (p->timer)
        event_free(p->timer);
    free(p);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    gw_pending *p = arg;

    sf_map_del(p->ctx->pending, p->id);
    sf_info("msg=\"call deadline passed\" job=%s", p->id);
    p->cb(p->arg, NULL);
    pending_free(p);
}

/* ---- claim checks (sf_claim.h) ---- */

/* A reply whose large fields are in Redis: fetched one by one (taken, or read where the
 * answer may be asked for again), then handed to cb. */
typedef struct fetch {
    gw_job_cb cb;
    void *arg;
    const char *gone;  /* the error when a claim is gone */
    sf_reply r;
    int next, failed, expired;
} fetch;

static void fetch_end(fetch *f)
{
    sf_reply err;

    if (!f->failed) {
        f->cb(f->arg, &f->r);
    } else {
        sf_warn("msg=\"a claimed answer could not be fetched\" job=%s expired=%d", f->r.id,
                f->expired);
        sf_reply_init(&err);
        snprintf(err.id, sizeof(err.id), "%s", f->r.id);
        err.kind = SF_REPLY_ERROR;
        err.message = (char *)(f->expired ? f->gone :
                               "The platform's state store is unreachable, so the answer "
                               "could not be fetched; retry in a few seconds.");
        f->cb(f->arg, &err);
    }
    sf_reply_fini(&f->r);
    free(f);
}

static void on_claim_fetched(redisAsyncContext *ac, void *rep_, void *priv)
{
    redisReply *rep = rep_;
    fetch *f = priv;
    const char *name = f->r.claims.name[f->next++];

    (void)ac;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        json_t *v = json_stringn(rep->str, rep->len);
        if (v)
            json_object_set_new(f->r.result, name, v);
        else
            f->failed = 1;
    } else {
        f->failed = 1;
        f->expired |= rep && rep->type == REDIS_REPLY_NIL;
    }
    if (f->next == f->r.claims.n)
        fetch_end(f);
}

void gw_jobs_fetch_claims(gw_ctx *ctx, const char *team, sf_reply *r, int keep,
                          const char *gone, gw_job_cb cb, void *arg)
{
    fetch *f = calloc(1, sizeof(*f));
    int sent = 0;

    if (!f) {
        sf_reply err;
        sf_reply_init(&err);
        snprintf(err.id, sizeof(err.id), "%s", r->id);
        err.kind = SF_REPLY_ERROR;
        err.message = (char *)SF_MSG_SERVER_NOMEM;
        cb(arg, &err);
        sf_reply_fini(r);
        return;
    }
    f->cb = cb;
    f->arg = arg;
    f->gone = gone;
    f->r = *r; /* taken */
    for (int i = 0; i < r->claims.n; i++)
        if ((keep ? sf_claim_read : sf_claim_take)(ctx->redis, team, r->id, 1,
                                                   r->claims.name[i], on_claim_fetched, f) == 0)
            sent++;
        else
            break;
    if (sent == r->claims.n)
        return;
    /* Redis is down: the answers in flight still arrive (with NULL) and end it */
    f->failed = 1;
    f->r.claims.n = sent;
    if (sent == 0)
        fetch_end(f);
}

static void pending_fetched(void *arg, const sf_reply *r)
{
    gw_pending *p = arg;

    if (!p->cancelled)
        p->cb(p->arg, r);
    pending_free(p);
}

static void fetch_claims(gw_ctx *ctx, gw_pending *p, sf_reply *r)
{
    evtimer_del(p->timer);
    p->fetching = 1;
    gw_jobs_fetch_claims(ctx, p->team, r, p->keep_claims,
                         "The answer to this call could not be fetched from the platform's "
                         "state store (it expired); retry the call.", pending_fetched, p);
}

/* Arguments on their way to Redis before the job is sent. */
typedef struct put_op {
    gw_ctx *ctx;
    sf_job *job;
    gw_claims_cb cb;
    void *arg;
    int left, answered, stored;
    int over, full, down;
    sf_claims names;
} put_op;

static void claims_drop(gw_ctx *ctx, const sf_job *job, const sf_claims *names, int mask)
{
    for (int i = 0; i < names->n; i++)
        if (mask & (1 << i))
            sf_claim_drop(ctx->redis, job->team, job->id, 0, names->name[i], NULL, NULL);
}

void gw_jobs_claims_drop(gw_ctx *ctx, const sf_job *job)
{
    claims_drop(ctx, job, &job->claims, (1 << SF_CLAIMS_MAX) - 1);
}

static void on_claim_put(redisAsyncContext *ac, void *rep_, void *priv)
{
    redisReply *rep = rep_;
    put_op *op = priv;
    int i = op->answered++, v = sf_claim_put_verdict(rep, NULL), status = 0;

    (void)ac;
    if (v == 1)
        op->stored |= 1 << i;
    else if (v == 0)
        op->over = 1;
    else if (sf_redis_is_oom(rep))
        op->full = 1;
    else
        op->down = 1;
    if (--op->left > 0)
        return;
    if (op->over || op->full || op->down) {
        claims_drop(op->ctx, op->job, &op->names, op->stored);
        status = op->full ? -ENOSPC : op->over ? -EDQUOT : -EIO;
    } else {
        for (int k = 0; k < op->names.n; k++) {
            json_object_set_new(op->job->args, op->names.name[k], json_string(""));
            sf_claims_add(&op->job->claims, op->names.name[k]);
        }
    }
    op->cb(op->arg, status);
    free(op);
}

int gw_jobs_claim_args(gw_ctx *ctx, sf_job *job, const sf_tool *t, gw_claims_cb cb, void *arg)
{
    put_op *op = NULL;

    for (size_t i = 0; t && i < t->nclaims; i++) {
        json_t *v = json_object_get(job->args, t->claims[i]);
        if (!json_is_string(v) || json_string_length(v) < SF_CLAIM_MIN)
            continue;
        if (!op && !(op = calloc(1, sizeof(*op))))
            return -ENOMEM;
        sf_claims_add(&op->names, t->claims[i]);
    }
    if (!op)
        return 0;
    if (!job->id[0] && sf_id_new(job->id, "job_") < 0) {
        free(op);
        return -EIO;
    }
    op->ctx = ctx;
    op->job = job;
    op->cb = cb;
    op->arg = arg;
    for (int i = 0; i < op->names.n; i++) {
        json_t *v = json_object_get(job->args, op->names.name[i]);
        if (sf_claim_put(ctx->redis, job->team, job->id, 0, op->names.name[i],
                         json_string_value(v), json_string_length(v),
                         ctx->cfg.claim_team_mib << 20, on_claim_put, op) < 0)
            break;
        op->left++;
    }
    if (op->left < op->names.n) { /* Redis is down: nothing waits on the ones sent */
        if (op->left == 0) {
            free(op);
            return -EIO;
        }
        op->down = 1;
        op->names.n = op->left;
    }
    return 1;
}

static void on_reply(void *arg, rd_kafka_message_t *msg)
{
    gw_ctx *ctx = arg;
    sf_reply r;
    const char *why = NULL;
    gw_pending *p;

    if (msg->err) {
        if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            sf_warn("msg=\"reply consumer error\" err=\"%s\"", rd_kafka_message_errstr(msg));
        return;
    }
    if (msg->key_len == sizeof(PROBE_KEY) - 1 && !memcmp(msg->key, PROBE_KEY, msg->key_len))
        return;
    if (sf_reply_decode(msg->payload, msg->len, &r, &why) < 0) {
        char id[SF_ID_MAX];
        sf_warn("msg=\"malformed reply\" offset=%lld why=\"%s\"", (long long)msg->offset, why);
        /* Its caller still gets an answer, now rather than at the deadline. */
        if (sf_reply_peek_id(msg->payload, msg->len, id) < 0 || !(p = sf_map_del(ctx->pending, id)))
            return;
        sf_reply_init(&r);
        r.kind = SF_REPLY_ERROR;
        r.message = (char *)"The platform's answer to this call could not be read; retry, and "
                            "tell the operator if it happens again.";
        p->cb(p->arg, &r);
        pending_free(p);
        return;
    }
    if (r.kind == SF_REPLY_RESULT && r.claims.n > 0 && (p = sf_map_del(ctx->pending, r.id))) {
        fetch_claims(ctx, p, &r); /* takes r */
        return;
    }
    if (r.kind == SF_REPLY_PROGRESS) {
        p = sf_map_get(ctx->pending, r.id);
        if (p && p->progress && json_is_object(r.result))
            p->progress(p->arg, r.result);
        sf_reply_fini(&r);
        return;
    }
    if (!(p = sf_map_del(ctx->pending, r.id))) {
        if (r.kind != SF_REPLY_PROGRESS)
            sf_debug("msg=\"reply for no waiting call (late or duplicate)\" job=%s", r.id);
        sf_reply_fini(&r);
        return;
    }
    SF_TRACE(r.id, "ans", msg->partition);
    p->cb(p->arg, &r);
    pending_free(p);
    sf_reply_fini(&r);
}

/* Every job goes to sf.jobs signed as a gateway's (the scheduler checks it). */
static int produce_job(gw_ctx *ctx, const char *key, const void *p, size_t n)
{
    return sf_jobauth_produce(ctx->producer, SF_TOPIC_JOBS, key, p, n, SF_JOBAUTH_GATEWAY,
                              ctx->job_key);
}

static void republish_one(const char *key, void *val, void *arg)
{
    gw_pending *p = val;
    int *n = arg;

    if (p->msg && produce_job(p->ctx, p->sandbox[0] ? p->sandbox : p->team, p->msg, p->len) == 0)
        (*n)++;
}

static void on_probe(void *arg, int err)
{
    gw_ctx *ctx = arg;

    ctx->probing = 0;
    if (err == 0 && ctx->kafka_down) {
        ctx->kafka_down = 0;
        sf_info("msg=\"Kafka is reachable again\"");
    }
}

static void on_brokers_down(void *arg)
{
    gw_ctx *ctx = arg;

    if (!ctx->kafka_down)
        sf_warn("msg=\"no Kafka broker is reachable; calls fail fast until one is\"");
    ctx->kafka_down = 1;
}

/* A broker that restarted lost the jobs it held: every waiting call's job is published
 * again under its id (the worker's job guard runs each once and answers it once). */
static void on_cluster_tick(evutil_socket_t fd, short what, void *arg)
{
    gw_ctx *ctx = arg;
    char *now = rd_kafka_clusterid(ctx->producer, 0);
    int n = 0;

    /* while down, a small message to our own reply topic tells when Kafka takes them again */
    if (ctx->kafka_down && !ctx->probing &&
        sf_kafka_produce_cb(ctx->producer, ctx->reply_topic, PROBE_KEY, "", 0, on_probe, ctx) == 0)
        ctx->probing = 1;

    if (!now)
        return;
    if (ctx->cluster_id && strcmp(now, ctx->cluster_id) != 0) {
        sf_map_foreach(ctx->pending, republish_one, &n);
        sf_warn("msg=\"the Kafka cluster changed (a restarted broker); waiting jobs published "
                "again\" cluster=%s jobs=%d waiting=%zu", now, n, sf_map_len(ctx->pending));
    }
    rd_kafka_mem_free(ctx->producer, ctx->cluster_id);
    ctx->cluster_id = now;
}

int gw_jobs_start(gw_ctx *ctx, char *why, size_t whylen)
{
    struct timeval tick = {0, 500 * 1000};
    char group[96];
    int rc;

    sf_gateway_job_key(ctx->auth_secret, ctx->job_key);
    if (ctx->cfg.gateway_id[0]) { /* one reply topic per event-loop thread */
        if (!sf_id_valid(ctx->cfg.gateway_id) || strlen(ctx->cfg.gateway_id) > 40) {
            snprintf(why, whylen, "gateway_id must match [a-z0-9_-]{1,40}");
            return -1;
        }
        snprintf(ctx->id, sizeof(ctx->id), "%s-%d", ctx->cfg.gateway_id, ctx->index);
    } else if (sf_id_new(ctx->id, "gw_") < 0) {
        snprintf(why, whylen, "no randomness");
        return -1;
    }
    snprintf(ctx->reply_topic, sizeof(ctx->reply_topic), SF_TOPIC_REPLY_PREFIX "%s", ctx->id);
    ctx->d.kafka.on_brokers_down = on_brokers_down;
    ctx->d.kafka.down_arg = ctx;
    snprintf(group, sizeof(group), "sf-%s", ctx->id);
    if (!(ctx->pending = sf_map_new((size_t)ctx->cfg.max_pending)) ||
        !(ctx->calls = sf_map_new((size_t)ctx->cfg.max_pending)) ||
        !(ctx->teams || (ctx->teams = ctx->own_teams = gw_team_table_new(
                             (size_t)ctx->cfg.max_pending))) ||
        !(ctx->producer = sf_kafka_producer_new(&ctx->d.kafka, why, whylen)) ||
        !(ctx->consumer = sf_kafka_consumer_new(&ctx->d.kafka, group, why, whylen)))
        return -1;
    /* The reply topic is this process's own: a new one is read from its start; a stable
     * id's from its end (what an earlier run left there has nobody waiting for it). */
    if ((rc = sf_kafka_assign_all(ctx->consumer, ctx->producer, ctx->reply_topic,
                                  ctx->cfg.gateway_id[0] ? RD_KAFKA_OFFSET_END
                                                         : RD_KAFKA_OFFSET_BEGINNING,
                                  5000)) < 0) {
        snprintf(why, whylen, "cannot create or assign the reply topic %s (Kafka at %s)%s%s",
                 ctx->reply_topic, ctx->d.kafka.brokers, rc == -EACCES ? ": " : "",
                 rc == -EACCES ? sf_kafka_err_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
                               : "");
        return -1;
    }
    if (!(ctx->pump = sf_kafka_pump_new(ctx->d.base, ctx->consumer, ctx->producer, on_reply, ctx)) ||
        !(ctx->cluster_tick = event_new(ctx->d.base, -1, EV_PERSIST, on_cluster_tick, ctx))) {
        snprintf(why, whylen, "cannot start the reply consumer");
        return -1;
    }
    event_add(ctx->cluster_tick, &tick);
    return 0;
}

static void fail_one(const char *key, void *val, void *arg)
{
    gw_pending *p = val;

    p->cb(p->arg, NULL);
    pending_free(p);
}

void gw_jobs_fail_all(gw_ctx *ctx)
{
    sf_map *m = ctx->pending;

    if (!m || !(ctx->pending = sf_map_new((size_t)ctx->cfg.max_pending))) {
        ctx->pending = m;
        return;
    }
    sf_map_foreach(m, fail_one, NULL);
    sf_map_free(m);
}

size_t gw_jobs_waiting(const gw_ctx *ctx)
{
    return ctx->pending ? sf_map_len(ctx->pending) : 0;
}

/* At stop the HTTP server is gone already (its requests were aborted and cancelled
 * their calls); anything left has nobody to answer. */
static void drop_one(const char *key, void *val, void *arg)
{
    pending_free(val);
}

void gw_jobs_stop(gw_ctx *ctx)
{
    if (ctx->pending) {
        sf_map_foreach(ctx->pending, drop_one, NULL);
        sf_map_free(ctx->pending);
        ctx->pending = NULL;
    }
    gw_team_table_free(ctx->own_teams);
    ctx->own_teams = ctx->teams = NULL;
    sf_map_free(ctx->calls);        /* empty: every call unregistered when it ended */
    ctx->calls = NULL;
    if (ctx->cluster_tick)
        event_free(ctx->cluster_tick);
    ctx->cluster_tick = NULL;
    rd_kafka_mem_free(ctx->producer, ctx->cluster_id);
    ctx->cluster_id = NULL;
    sf_kafka_pump_free(ctx->pump);
    ctx->pump = NULL;
    sf_kafka_consumer_free(ctx->consumer);
    sf_kafka_producer_free(ctx->producer);
    ctx->consumer = NULL;
    ctx->producer = NULL;
}

int gw_jobs_submit(gw_ctx *ctx, sf_job *job, int64_t wait_ms, gw_job_cb cb, void *arg,
                   gw_pending **out)
{
    gw_pending *p;
    sf_buf b;
    int rc;

    if (!job->id[0] && sf_id_new(job->id, "job_") < 0) /* set: an idempotent call's */
        return -EIO;
    if (sf_map_get(ctx->pending, job->id))
        return -EALREADY;
    snprintf(job->reply, sizeof(job->reply), "%s", ctx->reply_topic);
    job->deadline_ms = sf_now_ms() + wait_ms;
    if ((rc = team_enter(ctx, job->team)) < 0)
        return rc;
    if (!(p = calloc(1, sizeof(*p)))) {
        team_leave(ctx, job->team);
        return -ENOMEM;
    }
    p->ctx = ctx;
    memcpy(p->team, job->team, sizeof(p->team));
    memcpy(p->sandbox, job->sandbox, sizeof(p->sandbox));
    p->cb = cb;
    p->arg = arg;
    memcpy(p->id, job->id, sizeof(p->id));
    if (!(p->timer = evtimer_new(ctx->d.base, on_deadline, p))) {
        pending_free(p);
        return -ENOMEM;
    }
    if ((rc = sf_map_put(ctx->pending, p->id, p)) < 0) {
        pending_free(p);
        return rc;
    }
    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_job_encode(job, &b);
    if (rc == -E2BIG)
        rc = -EMSGSIZE;
    if (rc == 0)
        rc = produce_job(ctx, job->sandbox[0] ? job->sandbox : job->team, b.p, b.len);
    if (rc == 0)
        SF_TRACE(job->id, "pub", 0);
    if (rc == 0 && b.len <= KEEP_JOB_MAX && (p->msg = malloc(b.len)))
        memcpy(p->msg, b.p, (p->len = b.len));
    sf_buf_fini(&b);
    if (rc < 0) {
        sf_map_del(ctx->pending, p->id);
        pending_free(p);
        return rc;
    }
    {
        struct timeval tv = {(time_t)(wait_ms / 1000), (suseconds_t)(wait_ms % 1000) * 1000};
        evtimer_add(p->timer, &tv);
    }
    if (out) /* NULL: the caller never cancels it (fire and forget) */
        *out = p;
    return 0;
}

void gw_jobs_cancel(gw_ctx *ctx, gw_pending *p)
{
    if (!p)
        return;
    if (p->fetching) { /* the fetch ends it, without its callback */
        p->cancelled = 1;
        return;
    }
    sf_map_del(ctx->pending, p->id);
    pending_free(p);
}

void gw_jobs_on_progress(gw_pending *p, gw_progress_cb cb)
{
    if (p)
        p->progress = cb;
}

const char *gw_jobs_id(const gw_pending *p)
{
    return p ? p->id : "";
}

void gw_jobs_keep_claims(gw_pending *p)
{
    p->keep_claims = 1;
}

int gw_jobs_abandon(gw_ctx *ctx, gw_pending *p)
{
    sf_job job;
    sf_buf b;
    int rc;

    if (!p)
        return -EINVAL;
    sf_job_init(&job);
    if (sf_id_new(job.id, "job_") < 0) {
        gw_jobs_cancel(ctx, p);
        return -EIO;
    }
    memcpy(job.team, p->team, sizeof(job.team));
    memcpy(job.sandbox, p->sandbox, sizeof(job.sandbox));
    snprintf(job.tool, sizeof(job.tool), "%s", GW_TOOL_CANCEL);
    snprintf(job.reply, sizeof(job.reply), "%s", ctx->reply_topic);
    job.deadline_ms = sf_now_ms() + 10000;
    job.args = json_pack("{s:s}", "job", p->id);
    sf_buf_init(&b, SF_MSG_MAX);
    rc = job.args ? sf_job_encode(&job, &b) : -ENOMEM;
    if (rc == 0)
        rc = produce_job(ctx, job.sandbox[0] ? job.sandbox : job.team, b.p, b.len);
    sf_info("msg=\"call cancelled\" job=%s cancel_job=%s team=%s sandbox=%s rc=%d", p->id, job.id,
            job.team, job.sandbox, rc);
    sf_buf_fini(&b);
    sf_job_fini(&job);
    gw_jobs_cancel(ctx, p);
    return rc;
}
