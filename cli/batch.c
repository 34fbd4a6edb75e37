/* batch.c: `sandfleet batch run JOBS.jsonl --out RESULTS.jsonl`: tool calls straight onto
 * the job queue (sf.jobs), signed with the credential of $SANDFLEET_API_KEY
 * (common/sf_jobauth.h), at most --concurrency in flight, answers on a reply topic of the
 * batch's own, one result line per job. Job ids follow from the key, the --out file and
 * each line's id, so a run again after an interruption skips the lines whose result is in
 * --out and sends the others under the same ids: a job that ran already is answered
 * from the worker's job guard, never run twice. */
#include "cli.h"
#include "sf_claim.h"
#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_jobauth.h"
#include "sf_kafka.h"
#include "sf_map.h"
#include "sf_trace.h"
#include "sf_msg.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LINE_MAX_BYTES (1024 * 1024) /* one job line; a job is one Kafka message */
#define USER_ID_MAX 256
#define JOBS_MAX 10000000            /* lines in one batch */
#define CONC_MAX 4096
#define LAT_MAX 1000000              /* latency samples kept for the summary */

static const char usage[] =
    "usage: sandfleet batch run JOBS.jsonl --out RESULTS.jsonl [--concurrency N] [--timeout S]\n"
    "  JOBS.jsonl: one call a line, {\"id\": \"...\", \"tool\": \"...\", \"arguments\": {...}}\n"
    "  RESULTS.jsonl: one line a job, {\"id\", \"result\"} or {\"id\", \"error\": {code, message}};\n"
    "    run the same command again after an interruption: jobs with a result are skipped,\n"
    "    the others are sent again under the same job ids (none runs twice)\n"
    "  --concurrency N  jobs in flight (default 64, at most 4096)\n"
    "  --timeout S      each job's deadline (default 300 s)\n"
    "  --rate R         send at most R jobs a second (default: as fast as answers come)\n"
    "settings: SANDFLEET_API_KEY (the team's key); SF_KAFKA_BROKERS from the environment,\n"
    "          else from $SF_HOME/env (written by ops/run)\n";

typedef struct inflight {
    char *uid;          /* the line's id */
    int64_t sent_ms;    /* monotonic */
} inflight;

typedef struct batch {
    struct event_base *base;
    struct event *ev_tick, *ev_int, *ev_term;
    rd_kafka_t *producer, *consumer;
    sf_kafka_pump *pump;
    sf_kafka_settings ks;
    sf_common_cfg kcfg; /* the SF_KAFKA_* settings ks points into */
    FILE *in;
    int out_fd;
    char *line;
    long lineno;
    int eof;
    char pid[SF_PRODUCER_ID_LEN + 1];
    uint8_t psk[32], salt[32];
    char topic[SF_TOPIC_MAX];
    sf_map *seen;       /* ids with a result, or sent in this run: uid -> (void *)1 */
    sf_map *flight;     /* job id -> inflight */
    long conc, timeout_s;
    double rate;        /* jobs/s cap (0: none) */
    long sent;          /* jobs sent in this run */
    long total, done, done_before, errors;
    int64_t start_ms, last_print_ms, last_expire_ms;
    int tty, interrupted, failed;
    int64_t *lat;       /* ms per answered job of this run */
    size_t nlat;
    redisContext *redis; /* for claimed result values, connected at the first (or NULL) */
    int redis_tried;
    char team[SF_ID_MAX]; /* the key's team, which names its claims */
} batch;

/* Appends one result line (the whole line in one write, so a kill leaves no half line
 * but possibly the last one cut, which the next run drops). */
static int write_line(batch *b, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    size_t n, off = 0;

    if (!s)
        return -ENOMEM;
    n = strlen(s);
    s[n] = '\n'; /* json_dumps' NUL becomes the newline */
    while (off < n + 1) {
        ssize_t w = write(b->out_fd, s + off, n + 1 - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "\nsandfleet: cannot write the results file: %s.\n", strerror(errno));
            free(s);
            b->failed = 1;
            event_base_loopbreak(b->base);
            return -EIO;
        }
        off += (size_t)w;
    }
    free(s);
    return 0;
}

static void result_error(batch *b, const char *uid, long lineno, const char *code, const char *msg)
{
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "id", uid, "error", "code", code, "message", msg);

    if (lineno > 0)
        json_object_set_new(o, "line", json_integer(lineno));
    write_line(b, o);
    json_decref(o);
    b->done++;
    b->errors++;
}

/* The job id of a line: producer id + '-' + 32 hex of a keyed hash of the line's id under
 * the batch's salt (its --out file): stable across runs, distinct across batches. */
static void job_id_of(const batch *b, const char *uid, char out[SF_ID_MAX])
{
    uint8_t h[16];
    char hex[33];

    crypto_generichash(h, sizeof(h), (const uint8_t *)uid, strlen(uid), b->salt, sizeof(b->salt));
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    snprintf(out, SF_ID_MAX, "%s-%s", b->pid, hex);
}

/* The id a line's sandbox_create gives its new sandbox (when it names none): "sb_" + 24 hex
 * of the same keyed hash, so a create sent again after an interruption is the same create. */
static void sandbox_id_of(const batch *b, const char *uid, char out[SF_ID_MAX])
{
    uint8_t h[12];
    char hex[25];

    crypto_generichash(h, sizeof(h), (const uint8_t *)uid, strlen(uid), b->salt, sizeof(b->salt));
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    snprintf(out, SF_ID_MAX, "sb_%s", hex);
}

/* Reads the next line into b->line: 1, 0 at the end, 2 for a line over LINE_MAX_BYTES (its
 * rest skipped). */
static int read_line(batch *b)
{
    size_t n;

    if (!fgets(b->line, LINE_MAX_BYTES + 2, b->in))
        return 0;
    b->lineno++;
    n = strlen(b->line);
    if (n > 0 && b->line[n - 1] == '\n') {
        b->line[n - 1] = '\0';
        return 1;
    }
    if (n <= LINE_MAX_BYTES)
        return 1; /* the last line, without its newline */
    while (fgets(b->line, LINE_MAX_BYTES + 2, b->in)) {
        n = strlen(b->line);
        if (n > 0 && b->line[n - 1] == '\n')
            break;
    }
    return 2;
}

static int blank(const char *s)
{
    return s[strspn(s, " \t\r")] == '\0';
}

/* The id of a job line as text: a string (1-256 bytes) or an integer. */
static int user_id(json_t *v, char out[USER_ID_MAX + 1])
{
    if (json_is_string(v) && json_string_length(v) >= 1 && json_string_length(v) <= USER_ID_MAX &&
        !memchr(json_string_value(v), '\0', json_string_length(v))) {
        memcpy(out, json_string_value(v), json_string_length(v) + 1);
        return 0;
    }
    if (json_is_integer(v)) {
        snprintf(out, USER_ID_MAX + 1, "%lld", (long long)json_integer_value(v));
        return 0;
    }
    return -EINVAL;
}

static int tool_valid(const char *t)
{
    size_t n = strlen(t);
    return n >= 1 && n < SF_ID_MAX && strspn(t, "abcdefghijklmnopqrstuvwxyz0123456789_.") == n;
}

/* Sends one line's job, or writes its error result. 0 when a line was used (sent, answered
 * or skipped), 1 at the end of the input. */
static int send_next(batch *b)
{
    char uid[USER_ID_MAX + 1], lid[32], jid[SF_ID_MAX], text[512];
    json_t *o = NULL, *args;
    json_error_t jerr;
    const char *tool, *sid;
    inflight *f;
    sf_job job;
    sf_buf buf;
    int r = read_line(b), rc;

    if (r == 0)
        return 1;
    snprintf(lid, sizeof(lid), "line-%ld", b->lineno);
    if (r == 2) {
        if (!sf_map_get(b->seen, lid)) {
            sf_map_put(b->seen, lid, (void *)1);
            result_error(b, lid, b->lineno, SF_ERR_INVALID,
                         "The line is longer than 1 MiB; a job is one queue message: put large "
                         "inputs in a file in the sandbox first.");
        }
        return 0;
    }
    if (blank(b->line))
        return 0;
    if (!(o = json_loads(b->line, JSON_REJECT_DUPLICATES, &jerr)) || !json_is_object(o) ||
        user_id(json_object_get(o, "id"), uid) < 0) {
        if (!sf_map_get(b->seen, lid)) {
            sf_map_put(b->seen, lid, (void *)1);
            if (!o)
                snprintf(text, sizeof(text), "The line is not JSON (%s at column %d); fix it "
                         "and run the batch again.", jerr.text, jerr.column);
            else
                snprintf(text, sizeof(text), "The line needs an \"id\" (a string of 1-256 bytes "
                         "or an integer) and a \"tool\"; fix it and run the batch again.");
            result_error(b, lid, b->lineno, SF_ERR_INVALID, text);
        }
        json_decref(o);
        return 0;
    }
    if (sf_map_get(b->seen, uid)) { /* done in an earlier run, or a second line with this id */
        json_decref(o);
        if (!sf_map_get(b->seen, lid) && (intptr_t)sf_map_get(b->seen, uid) == 2) {
            /* sent in this run already: the line repeats an id */
            sf_map_put(b->seen, lid, (void *)1);
            snprintf(text, sizeof(text), "The id \"%.200s\" is on an earlier line too; give "
                     "each line its own id (this line was not run).", uid);
            result_error(b, lid, b->lineno, SF_ERR_INVALID, text);
        }
        return 0;
    }
    tool = json_string_value(json_object_get(o, "tool"));
    args = json_object_get(o, "arguments");
    if (!tool || !tool_valid(tool) || (args && !json_is_object(args))) {
        sf_map_put(b->seen, uid, (void *)2);
        result_error(b, uid, b->lineno, SF_ERR_INVALID,
                     "The line needs \"tool\" (a tool name such as sandbox_exec) and "
                     "\"arguments\" (an object, may be omitted); fix it and run the batch again.");
        json_decref(o);
        return 0;
    }
    job_id_of(b, uid, jid);
    sf_job_init(&job);
    snprintf(job.id, sizeof(job.id), "%s", jid);
    snprintf(job.team, sizeof(job.team), "batch"); /* the scheduler takes the key's team */
    snprintf(job.tool, sizeof(job.tool), "%s", tool);
    snprintf(job.reply, sizeof(job.reply), "%s", b->topic);
    job.deadline_ms = sf_now_ms() + b->timeout_s * 1000;
    job.args = args ? json_incref(args) : json_object();
    sid = json_string_value(json_object_get(job.args, "sandbox_id"));
    if (sid && sf_id_valid(sid))
        snprintf(job.sandbox, sizeof(job.sandbox), "%s", sid);
    else if (!strcmp(tool, "sandbox_create")) /* a create sent again makes the same sandbox */
        sandbox_id_of(b, uid, job.sandbox);
    sf_buf_init(&buf, SF_MSG_MAX);
    if ((rc = sf_job_encode(&job, &buf)) < 0) {
        result_error(b, uid, b->lineno, rc == -E2BIG ? SF_ERR_LIMIT : SF_ERR_INVALID,
                     rc == -E2BIG ? "The job is larger than the 1 MiB queue message limit; put "
                                    "large inputs in a file in the sandbox first."
                                  : "The job's arguments cannot be encoded (nested deeper than "
                                    "32 levels?); fix the line and run the batch again.");
        goto done;
    }
    /* a full local queue drains as the broker confirms: wait a little for room */
    for (int i = 0; (rc = sf_jobauth_produce(b->producer, SF_TOPIC_JOBS,
                                             job.sandbox[0] ? job.sandbox : job.id, buf.p, buf.len,
                                             b->pid, b->psk)) == -ENOBUFS && i < 100; i++)
        rd_kafka_poll(b->producer, 100);
    if (rc == 0)
        SF_TRACE(job.id, "pub", 0);
    if (rc == -E2BIG) {
        result_error(b, uid, b->lineno, SF_ERR_LIMIT, "The job is larger than the queue's "
                     "message limit; put large inputs in a file in the sandbox first.");
    } else if (rc < 0) { /* no result: a run again sends it */
        fprintf(stderr, "%ssandfleet: cannot put jobs on the queue (%s); run the same command "
                "again to finish.\n", b->tty ? "\n" : "", strerror(-rc));
        b->failed = 1;
        event_base_loopbreak(b->base);
    }
done:
    sf_buf_fini(&buf);
    sf_job_fini(&job);
    json_decref(o);
    if (b->failed)
        return 1;
    sf_map_put(b->seen, uid, (void *)2);
    if (rc < 0)
        return 0;
    if (!(f = calloc(1, sizeof(*f))) || !(f->uid = strdup(uid)) || sf_map_put(b->flight, jid, f) < 0) {
        if (f)
            free(f->uid);
        free(f);
        fprintf(stderr, "\nsandfleet: out of memory.\n");
        b->failed = 1;
        event_base_loopbreak(b->base);
        return 1;
    }
    f->sent_ms = sf_mono_ms();
    return 0;
}

static void finish_if_done(batch *b)
{
    if (b->eof && sf_map_len(b->flight) == 0)
        event_base_loopbreak(b->base);
}

/* True while --rate allows one more job now. */
static int rate_allows(const batch *b)
{
    return b->rate <= 0 || b->sent < (long)((sf_mono_ms() - b->start_ms) * b->rate / 1000.0) + 1;
}

static void fill(batch *b)
{
    while (!b->eof && !b->failed && (long)sf_map_len(b->flight) < b->conc && rate_allows(b)) {
        size_t before = sf_map_len(b->flight);
        if (send_next(b))
            b->eof = 1;
        if (sf_map_len(b->flight) > before)
            b->sent++;
    }
    finish_if_done(b);
}

/* The claimed fields of a result (values of 256 KiB or more wait in the platform's Redis
 * for 5 minutes: envelope.md, "Claim checks") are read into it, where Redis is reachable
 * (SF_REDIS_URL). Read, not taken: they go with their TTL, so a run again finds them too.
 * Those left unfetched stay in r->claims (listed under "claims" for the caller). */
static void fetch_claims(batch *b, sf_reply *r)
{
    char key[SF_CLAIM_KEY_MAX];
    sf_claims left = {0};
    redisReply *rep;

    if (!b->redis_tried) {
        b->redis_tried = 1;
        if ((b->redis = cli_redis())) {
            rep = sf_redis_sync_cmd(b->redis, "HGET " SF_RK_PRODUCER " team", b->pid);
            if (rep && rep->type == REDIS_REPLY_STRING && rep->len < sizeof(b->team))
                snprintf(b->team, sizeof(b->team), "%s", rep->str);
            freeReplyObject(rep);
        }
        if (!b->team[0])
            fprintf(stderr, "%ssandfleet: results over 256 KiB stay in the platform's Redis "
                    "(their fields are listed under \"claims\"): %s\n", b->tty ? "\n" : "",
                    b->redis ? "this key has no producer record" : "Redis is unreachable");
    }
    for (int i = 0; i < r->claims.n; i++) {
        int got = 0;
        if (b->team[0] &&
            sf_claim_key(key, sizeof(key), b->team, r->id, 1, r->claims.name[i]) == 0 &&
            (rep = sf_redis_sync_cmd(b->redis, "GET %s", key))) {
            got = rep->type == REDIS_REPLY_STRING &&
                  json_object_set_new(r->result, r->claims.name[i],
                                      json_stringn(rep->str, rep->len)) == 0;
            freeReplyObject(rep);
        }
        if (!got)
            sf_claims_add(&left, r->claims.name[i]);
    }
    r->claims = left;
}

static void on_reply(void *arg, rd_kafka_message_t *msg)
{
    batch *b = arg;
    char id[SF_ID_MAX];
    const char *why = NULL;
    inflight *f;
    sf_reply r;
    json_t *o;

    if (msg->err) {
        if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            fprintf(stderr, "%ssandfleet: reply topic: %s\n", b->tty ? "\n" : "",
                    rd_kafka_message_errstr(msg));
        return;
    }
    if (sf_reply_decode(msg->payload, msg->len, &r, &why) < 0) {
        if (sf_reply_peek_id(msg->payload, msg->len, id) == 0 && (f = sf_map_del(b->flight, id))) {
            char text[400];
            snprintf(text, sizeof(text), "The job's reply could not be read (%s).", why);
            result_error(b, f->uid, 0, SF_ERR_INTERNAL, text);
            free(f->uid);
            free(f);
            fill(b);
        }
        return;
    }
    if (r.kind == SF_REPLY_PROGRESS || !(f = sf_map_del(b->flight, r.id))) {
        sf_reply_fini(&r); /* progress, or an answer already taken (a repeat) */
        return;
    }
    SF_TRACE(r.id, "ans", msg->partition);
    if (r.kind == SF_REPLY_ERROR) {
        o = json_pack("{s:s, s:{s:s, s:s}}", "id", f->uid, "error", "code", r.code, "message",
                      r.message ? r.message : "");
        b->errors++;
    } else {
        if (r.claims.n > 0)
            fetch_claims(b, &r);
        o = json_pack("{s:s, s:O}", "id", f->uid, "result", r.result ? r.result : json_null());
        if (r.claims.n > 0) { /* values over 256 KiB left in the platform's Redis */
            json_t *c = json_array();
            for (int i = 0; i < r.claims.n; i++)
                json_array_append_new(c, json_string(r.claims.name[i]));
            json_object_set_new(o, "claims", c);
        }
    }
    write_line(b, o);
    json_decref(o);
    if (b->nlat < LAT_MAX)
        b->lat[b->nlat++] = sf_mono_ms() - f->sent_ms;
    b->done++;
    free(f->uid);
    free(f);
    sf_reply_fini(&r);
    fill(b);
}

static void progress(batch *b, int final)
{
    int64_t now = sf_mono_ms(), el = now - b->start_ms;
    long run_done = b->done - b->done_before, left = b->total - b->done;
    double rate = el > 0 ? run_done * 1000.0 / (double)el : 0;
    long eta = rate > 0 ? (long)(left / rate) : -1;
    char etas[32];

    if (!final && now - b->last_print_ms < (b->tty ? 200 : 5000))
        return;
    b->last_print_ms = now;
    if (eta >= 0)
        snprintf(etas, sizeof(etas), "%ld:%02ld", eta / 60, eta % 60);
    else
        snprintf(etas, sizeof(etas), "-");
    if (b->tty) {
        char bar[31];
        int fillc = b->total > 0 ? (int)(30 * b->done / b->total) : 30;
        memset(bar, '#', (size_t)fillc);
        memset(bar + fillc, '-', (size_t)(30 - fillc));
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %ld/%ld  %.0f jobs/s  ETA %s   %s", bar, b->done, b->total, rate,
                etas, final ? "\n" : "");
    } else {
        fprintf(stderr, "batch: %ld/%ld done, %.0f jobs/s, ETA %s\n", b->done, b->total, rate,
                etas);
    }
}

typedef struct expire_ctx {
    batch *b;
    int64_t now;
    char (*ids)[SF_ID_MAX];
    size_t n, cap;
} expire_ctx;

static void find_expired(const char *key, void *val, void *arg)
{
    expire_ctx *e = arg;
    inflight *f = val;

    if (e->now - f->sent_ms > (e->b->timeout_s + 10) * 1000 && e->n < e->cap)
        snprintf(e->ids[e->n++], SF_ID_MAX, "%s", key);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    batch *b = arg;
    char ids[64][SF_ID_MAX];
    expire_ctx e = {b, sf_mono_ms(), ids, 0, 64};

    (void)fd;
    (void)what;
    if (e.now - b->last_expire_ms >= 1000) { /* the tick is 5 ms when paced */
        b->last_expire_ms = e.now;
        sf_map_foreach(b->flight, find_expired, &e);
    }
    for (size_t i = 0; i < e.n; i++) {
        inflight *f = sf_map_del(b->flight, ids[i]);
        char text[256];
        snprintf(text, sizeof(text), "No answer within the job's %ld s deadline; its outcome is "
                 "unknown (see the platform's logs for job %s).", b->timeout_s, ids[i]);
        result_error(b, f->uid, 0, SF_ERR_TIMEOUT, text);
        free(f->uid);
        free(f);
    }
    fill(b);
    progress(b, 0);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    batch *b = arg;

    (void)sig;
    (void)what;
    b->interrupted = 1;
    event_base_loopbreak(b->base);
}

/* Reads the results already in out: their ids are skipped. A last line cut by a kill is
 * dropped (the file is cut back to its last newline). 0 or 1 after printing why. */
static int load_results(batch *b, const char *path)
{
    FILE *f = fdopen(dup(b->out_fd), "r");
    char *line = NULL, uid[USER_ID_MAX + 1];
    size_t cap = 0;
    ssize_t n;
    off_t good = 0;

    if (!f) {
        fprintf(stderr, "sandfleet: cannot read %s: %s.\n", path, strerror(errno));
        return 1;
    }
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *o;
        if (line[n - 1] != '\n')
            break; /* cut by a kill */
        good += n;
        if ((o = json_loads(line, 0, NULL)) && user_id(json_object_get(o, "id"), uid) == 0 &&
            !sf_map_get(b->seen, uid) && sf_map_put(b->seen, uid, (void *)1) == 0)
            b->done++;
        json_decref(o);
    }
    fclose(f);
    free(line);
    if (ftruncate(b->out_fd, good) < 0) {
        fprintf(stderr, "sandfleet: cannot repair %s: %s.\n", path, strerror(errno));
        return 1;
    }
    b->done_before = b->done;
    return 0;
}

/* Lines of the input that are not blank (the progress total). */
static long count_jobs(FILE *in, char *buf)
{
    long n = 0;
    int start = 1;

    while (fgets(buf, LINE_MAX_BYTES + 2, in)) {
        size_t len = strlen(buf);
        if (start && buf[strspn(buf, " \t\r\n")] != '\0')
            n++;
        start = len > 0 && buf[len - 1] == '\n';
    }
    rewind(in);
    return n;
}

/* Credentials or ACLs refused (from a Kafka poll): what to fix, once per sentence. */
static void print_refused(const char *sentence, const char *detail)
{
    static const char *last;

    if (sentence != last)
        fprintf(stderr, "sandfleet: %s (%s)\n", sentence, detail);
    last = sentence;
}

static int setup(batch *b, const char *jobs, const char *out, const char *key)
{
    char why[512], real[PATH_MAX], rid[SF_ID_MAX];
    int rc;
    const char *brokers = cli_setting("SF_KAFKA_BROKERS", "127.0.0.1:9092");

    { /* the broker answers a waiting fetch when data arrives; kafka_fetch_wait_ms
       * (SF_KAFKA_FETCH_WAIT_MS) from the daemons' own table */
        sf_common_cfg *cc = &b->kcfg;
        if (sf_common_config_load(cc, why, sizeof(why)) < 0) {
            fprintf(stderr, "sandfleet: %s\n", why);
            return 1;
        }
        b->ks.fetch_wait_ms = (int)cc->kafka_fetch_wait_ms;
        /* the batch producer's own Kafka user (SF_KAFKA_SASL_*: ops/RUNBOOK.md) */
        if (sf_kafka_security_set(&b->ks, cc->kafka_security_protocol, cc->kafka_sasl_mechanism,
                                  cc->kafka_sasl_username, cc->kafka_sasl_password_file, why,
                                  sizeof(why)) < 0) {
            fprintf(stderr, "sandfleet: %s\n", why);
            return 1;
        }
        b->ks.on_refused = print_refused;
    }
    if (sf_producer_derive(key, b->pid, b->psk) < 0) {
        fprintf(stderr, "sandfleet: SANDFLEET_API_KEY is not a sandfleet API key (sf_live_...); "
                        "create one with 'sandfleet keys create --team TEAM'.\n");
        return 1;
    }
    if (!(b->in = fopen(jobs, "re"))) {
        fprintf(stderr, SF_MSG_CLI_CANNOT_OPEN_FMT, jobs, strerror(errno));
        return 1;
    }
    if ((b->out_fd = open(out, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0 ||
        !realpath(out, real)) {
        fprintf(stderr, SF_MSG_CLI_CANNOT_OPEN_FMT, out, strerror(errno));
        return 1;
    }
    /* the batch's salt: its results file, so two batches with the same line ids differ */
    crypto_generichash(b->salt, sizeof(b->salt), (const uint8_t *)real, strlen(real), b->psk, 32);
    /* one reply topic per key, not per batch: topics are not deleted on a real cluster,
     * and the producers answering on it (schedulers, workers) know it after the first
     * batch (a topic new to them costs its first answers a metadata round, ~0.5 s) */
    snprintf(b->topic, sizeof(b->topic), SF_TOPIC_REPLY_PREFIX "%s", b->pid);
    if (!(b->seen = sf_map_new(JOBS_MAX)) || !(b->flight = sf_map_new(CONC_MAX * 2)) ||
        !(b->line = malloc(LINE_MAX_BYTES + 2)) || !(b->lat = malloc(LAT_MAX * sizeof(int64_t))) ||
        !(b->base = event_base_new())) {
        fprintf(stderr, SF_MSG_CLI_NOMEM);
        return 1;
    }
    if (load_results(b, out))
        return 1;
    b->total = count_jobs(b->in, b->line);
    b->ks.brokers = brokers;
    b->ks.session_timeout_ms = 6000;
    b->ks.linger_ms = 1;
    if (sf_trace_open(getenv("SF_TRACE_DIR"), "batch") < 0) { /* stage stamps: benchmarks */
        fprintf(stderr, "sandfleet: cannot write stage stamps in SF_TRACE_DIR %s; check the "
                "folder.\n", getenv("SF_TRACE_DIR"));
        return 1;
    }
    sf_id_new(rid, "batch_");
    if (!(b->producer = sf_kafka_producer_new(&b->ks, why, sizeof(why))) ||
        !(b->consumer = sf_kafka_consumer_new(&b->ks, rid, why, sizeof(why)))) {
        fprintf(stderr, "sandfleet: Kafka: %s\n", why);
        return 1;
    }
    if ((rc = sf_kafka_assign_all(b->consumer, b->producer, b->topic, RD_KAFKA_OFFSET_END,
                                  15000)) == -EACCES) {
        fprintf(stderr, "sandfleet: reply topic %s: %s\n", b->topic,
                sf_kafka_err_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED));
        return 1;
    }
    if (rc < 0) {
        fprintf(stderr, "sandfleet: cannot reach the job queue at %s (reply topic %s); is the "
                        "stack running (ops/run)? Otherwise set SF_KAFKA_BROKERS.\n",
                brokers, b->topic);
        return 1;
    }
    { /* the job topic's leaders known before the clock starts (else the first jobs wait) */
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(b->producer, SF_TOPIC_JOBS, NULL);
        const struct rd_kafka_metadata *md = NULL;
        if (rkt && rd_kafka_metadata(b->producer, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR)
            rd_kafka_metadata_destroy(md);
        if (rkt)
            rd_kafka_topic_destroy(rkt);
    }
    if (!(b->pump = sf_kafka_pump_new(b->base, b->consumer, b->producer, on_reply, b)) ||
        !(b->ev_tick = event_new(b->base, -1, EV_PERSIST, on_tick, b)) ||
        !(b->ev_int = evsignal_new(b->base, SIGINT, on_signal, b)) ||
        !(b->ev_term = evsignal_new(b->base, SIGTERM, on_signal, b))) {
        fprintf(stderr, SF_MSG_CLI_NOMEM);
        return 1;
    }
    return 0;
}

static void free_flight(const char *key, void *val, void *arg)
{
    inflight *f = val;

    (void)key;
    (void)arg;
    free(f->uid);
    free(f);
}

static void teardown(batch *b)
{
    if (b->flight) {
        sf_map_foreach(b->flight, free_flight, NULL);
        sf_map_free(b->flight);
    }
    sf_map_free(b->seen);
    sf_kafka_pump_free(b->pump);
    if (b->ev_tick)
        event_free(b->ev_tick);
    if (b->ev_int)
        event_free(b->ev_int);
    if (b->ev_term)
        event_free(b->ev_term);
    sf_kafka_consumer_free(b->consumer);
    sf_kafka_producer_free(b->producer);
    if (b->redis)
        sf_redis_sync_free(b->redis);
    if (b->base)
        event_base_free(b->base);
    if (b->in)
        fclose(b->in);
    if (b->out_fd >= 0)
        close(b->out_fd);
    free(b->line);
    free(b->lat);
    sodium_memzero(b->psk, sizeof(b->psk));
    sodium_memzero(b->ks.sasl_password, sizeof(b->ks.sasl_password));
    sf_common_config_free(&b->kcfg);
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, c = *(const int64_t *)y;
    return (a > c) - (a < c);
}

static void summary(batch *b)
{
    int64_t el = sf_mono_ms() - b->start_ms;
    long run = b->done - b->done_before;

    fprintf(stderr, "batch: %ld results (%ld this run, %ld earlier), %ld errors, in %.1f s: "
            "%.0f jobs/s", b->done, run, b->done_before, b->errors, el / 1000.0,
            el > 0 ? run * 1000.0 / (double)el : 0.0);
    if (b->nlat > 0) {
        qsort(b->lat, b->nlat, sizeof(int64_t), cmp_i64);
        fprintf(stderr, "; latency p50 %lld ms, p99 %lld ms",
                (long long)b->lat[b->nlat / 2], (long long)b->lat[(b->nlat * 99) / 100]);
    }
    fprintf(stderr, "\n");
}

static int batch_run(int argc, char **argv)
{
    const char *out = cli_opt(argc, argv, "--out"), *conc = cli_opt(argc, argv, "--concurrency");
    const char *tmo = cli_opt(argc, argv, "--timeout"), *key = getenv("SANDFLEET_API_KEY");
    const char *rate = cli_opt(argc, argv, "--rate");
    const char *jobs = argc >= 2 && argv[1][0] != '-' ? argv[1] : NULL;
    struct timeval tick = {0, 100 * 1000}, paced = {0, 5 * 1000};
    int64_t v;
    batch b;
    int rc = 1;

    memset(&b, 0, sizeof(b));
    b.out_fd = -1;
    b.conc = 64;
    b.timeout_s = 300;
    if (!jobs || !out) {
        fputs(usage, stderr);
        return 2;
    }
    if ((conc && sf_parse_i64(conc, 1, CONC_MAX, &v) < 0) || (conc && (b.conc = v, 0)) ||
        (tmo && sf_parse_i64(tmo, 1, 86400, &v) < 0) || (tmo && (b.timeout_s = v, 0)) ||
        (rate && sf_parse_i64(rate, 1, 1000000, &v) < 0) || (rate && (b.rate = (double)v, 0))) {
        fprintf(stderr, "sandfleet: --concurrency is 1-4096, --timeout 1-86400 seconds and "
                        "--rate 1-1000000 jobs a second.\n");
        return 2;
    }
    if (!key || !*key) {
        fprintf(stderr, "sandfleet: SANDFLEET_API_KEY is not set: export the team's API key "
                        "(sandfleet keys create --team TEAM prints one).\n");
        return 1;
    }
    if (setup(&b, jobs, out, key) != 0)
        goto out;
    b.tty = isatty(STDERR_FILENO);
    b.start_ms = b.last_print_ms = sf_mono_ms();
    if (b.done_before > 0)
        fprintf(stderr, "batch: %ld results already in %s are kept; resuming.\n", b.done_before,
                out);
    event_add(b.ev_tick, b.rate > 0 ? &paced : &tick);
    event_add(b.ev_int, NULL);
    event_add(b.ev_term, NULL);
    fill(&b);
    if (!(b.eof && sf_map_len(b.flight) == 0) && !b.failed)
        event_base_dispatch(b.base);
    progress(&b, 1);
    if (b.interrupted) {
        fprintf(stderr, "batch: interrupted with %ld of %ld done; run the same command again to "
                        "finish (no job runs twice).\n", b.done, b.total);
        rc = 130;
        goto out;
    }
    if (!b.failed) {
        summary(&b);
        rc = 0;
    }
out:
    teardown(&b);
    return rc;
}

int cli_batch(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "run") != 0) {
        fputs(usage, stderr);
        return 2;
    }
    return batch_run(argc - 1, argv + 1);
}
