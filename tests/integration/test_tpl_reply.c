/* The answer to sandbox_template_create is on the call's tracked path (issue 21): the
 * job's offset on sf.jobs moves only once Kafka confirmed the answer, not merely the
 * build's forward to the host. Against the e2e stack (SF_E2E_STATE/env, SF_BUILD):
 *   1. the broker's topic table is filled (16,384 topics, a real limit of ops/kafka), so
 *      the answer's reply topic cannot be created and the answer waits in the
 *      scheduler's producer, while the forward (to an existing host topic) goes through;
 *   2. a marker job behind it on the same partition is answered (the forward is
 *      confirmed by then);
 *   3. the scheduler is stopped (TERM: it commits what it stored), the filler topics go,
 *      a new scheduler starts: the job comes again, and its answer arrives, once.
 * On the old tree the answer went out untracked: the forward's confirmation committed
 * the offset, the stopped scheduler's queued answer was dropped, and nobody answered. */
#include "check.h"
#include "sf_auth.h"
#include "sf_codec.h"
#include "sf_jobauth.h"
#include "sf_kafka.h"
#include "sf_store.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILL_MAX 16384 /* KB_TOPICS_MAX (ops/kafka/broker.h) */
#define FILL_BATCH 1000

static char brokers[2048], redis_url[1024], secret_file[4096], state[4096], build[4096];
static char rid[SF_ID_MAX], reply_late[SF_TOPIC_MAX], reply_now[SF_TOPIC_MAX];
static uint8_t gw_key[32];
static rd_kafka_t *producer;
static int filled; /* filler topics asked for (deleted by cleanup) */

static void unfill(void);
#undef CHECK_CLEANUP
#define CHECK_CLEANUP() unfill()

static void env_line(const char *line, const char *name, char *out, size_t n)
{
    size_t k = strlen(name);
    if (!strncmp(line, name, k) && line[k] == '=') {
        snprintf(out, n, "%s", line + k + 1);
        out[strcspn(out, "\n")] = 0;
    }
}

static void read_env(void)
{
    char path[4200], line[4200];
    const char *s = getenv("SF_E2E_STATE"), *b = getenv("SF_BUILD");
    FILE *f;

    CHECK(s && b, "SF_E2E_STATE or SF_BUILD is not set (run through ctest)");
    snprintf(state, sizeof(state), "%s", s);
    snprintf(build, sizeof(build), "%s", b);
    snprintf(path, sizeof(path), "%s/env", state);
    CHECK((f = fopen(path, "r")), "cannot open %s", path);
    while (fgets(line, sizeof(line), f)) {
        env_line(line, "SF_KAFKA_BROKERS", brokers, sizeof(brokers));
        env_line(line, "SF_REDIS_URL", redis_url, sizeof(redis_url));
        env_line(line, "SF_AUTH_SECRET_FILE", secret_file, sizeof(secret_file));
    }
    fclose(f);
    CHECK(brokers[0] && redis_url[0] && secret_file[0], "missing settings in %s", path);
}

/* Creates (create=1) or deletes the filler topics [from, to) with the admin API. */
static void fillers(int from, int to, int create)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(producer);
    char name[SF_TOPIC_MAX];

    for (int i = from; i < to; i += FILL_BATCH) {
        int n = to - i < FILL_BATCH ? to - i : FILL_BATCH;
        rd_kafka_NewTopic_t **nt = calloc((size_t)n, sizeof(*nt));
        rd_kafka_DeleteTopic_t **dt = calloc((size_t)n, sizeof(*dt));
        rd_kafka_event_t *ev;
        for (int k = 0; k < n; k++) {
            snprintf(name, sizeof(name), "trfill.%s.%d", rid, i + k);
            if (create)
                nt[k] = rd_kafka_NewTopic_new(name, 1, 1, NULL, 0);
            else
                dt[k] = rd_kafka_DeleteTopic_new(name);
        }
        if (create)
            rd_kafka_CreateTopics(producer, nt, (size_t)n, NULL, q);
        else
            rd_kafka_DeleteTopics(producer, dt, (size_t)n, NULL, q);
        ev = rd_kafka_queue_poll(q, 30000);
        if (ev)
            rd_kafka_event_destroy(ev);
        for (int k = 0; k < n; k++) {
            if (nt[k])
                rd_kafka_NewTopic_destroy(nt[k]);
            if (dt[k])
                rd_kafka_DeleteTopic_destroy(dt[k]);
        }
        free(nt);
        free(dt);
    }
    rd_kafka_queue_destroy(q);
}

static void unfill(void)
{
    int n = filled;

    filled = 0; /* (once, also when a CHECK inside fails) */
    if (n)
        fillers(0, n, 0);
}

/* A job onto sf.jobs as a gateway puts it, keyed `key` (one partition for one key). */
static void produce_job(const char *id, const char *tool, json_t *args, const char *reply)
{
    sf_job j;
    sf_buf b;

    sf_job_init(&j);
    snprintf(j.id, sizeof(j.id), "%s", id);
    snprintf(j.team, sizeof(j.team), "tplreply");
    snprintf(j.tool, sizeof(j.tool), "%s", tool);
    snprintf(j.reply, sizeof(j.reply), "%s", reply);
    j.deadline_ms = sf_now_ms() + 300000;
    j.args = args;
    sf_buf_init(&b, SF_MSG_MAX);
    CHECK(sf_job_encode(&j, &b) == 0, "encode");
    CHECK(sf_jobauth_produce(producer, SF_TOPIC_JOBS, rid, b.p, b.len, SF_JOBAUTH_GATEWAY,
                             gw_key) == 0, "produce %s", id);
    sf_buf_fini(&b);
    sf_job_fini(&j);
    rd_kafka_flush(producer, 10000);
}

/* The replies to job id on topic, read from its start: waits up to wait_ms for the first,
 * then 3 s more for a copy; *first: the first one's kind. */
static int count_replies(const char *topic, const char *id, int64_t wait_ms, int *first)
{
    sf_kafka_settings s = {.brokers = brokers, .fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512], group[SF_ID_MAX];
    rd_kafka_t *c;
    int64_t until = sf_mono_ms() + wait_ms;
    int n = 0;

    sf_id_new(group, "trg_");
    CHECK((c = sf_kafka_consumer_new(&s, group, why, sizeof(why))), "%s", why);
    CHECK(sf_kafka_assign_all(c, producer, topic, RD_KAFKA_OFFSET_BEGINNING, 10000) == 0,
          "assign %s", topic);
    while (sf_mono_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        sf_reply r;
        const char *w;
        if (!m)
            continue;
        if (!m->err && sf_reply_decode(m->payload, m->len, &r, &w) == 0) {
            if (!strcmp(r.id, id) && r.kind != SF_REPLY_PROGRESS) {
                if (n++ == 0) {
                    *first = r.kind;
                    until = sf_mono_ms() + 3000; /* a second copy would follow closely */
                }
            }
            sf_reply_fini(&r);
        }
        rd_kafka_message_destroy(m);
    }
    sf_kafka_consumer_free(c);
    return n;
}

static int scheduler_pid(void)
{
    char path[4200];
    FILE *f;
    int pid = 0;

    snprintf(path, sizeof(path), "%s/pids/scheduler", state);
    if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid;
}

int main(void)
{
    sf_kafka_settings s = {.brokers = brokers, .fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512], name[64], job_id[SF_ID_MAX], mark_id[SF_ID_MAX], cmd[9000];
    uint8_t secret[32];
    redisContext *rc;
    int pid, kind = -1, n;

    read_env();
    CHECK(sf_auth_secret_load(secret_file, secret, why, sizeof(why)) == 0, "%s", why);
    sf_gateway_job_key(secret, gw_key);
    sf_id_new(rid, "tr_");
    snprintf(reply_late, sizeof(reply_late), SF_TOPIC_REPLY_PREFIX "%.40s_late", rid);
    snprintf(reply_now, sizeof(reply_now), SF_TOPIC_REPLY_PREFIX "%.40s_now", rid);
    snprintf(name, sizeof(name), "trtpl%.14s", rid + 3);
    snprintf(job_id, sizeof(job_id), "%.40s-create", rid);
    snprintf(mark_id, sizeof(mark_id), "%.40s-mark", rid);
    CHECK((producer = sf_kafka_producer_new(&s, why, sizeof(why))), "%s", why);
    { /* reply_now exists before the broker is full */
        rd_kafka_t *c = sf_kafka_consumer_new(&s, rid, why, sizeof(why));
        CHECK(c && sf_kafka_assign_all(c, producer, reply_now, RD_KAFKA_OFFSET_BEGINNING,
                                       10000) == 0, "create %s", reply_now);
        sf_kafka_consumer_free(c);
    }

    /* 1. the broker full: no new topic can be made (the filler creates past the limit
     * are answered but not made) */
    filled = FILL_MAX;
    fillers(0, FILL_MAX, 1);
    printf("ok - the broker's topic table is full\n");

    produce_job(job_id, "sandbox_template_create",
                json_pack("{s:s, s:s}", "name", name, "from", "base"), reply_late);
    /* its record (written by the scheduler's script before it answers and forwards) */
    {
        char host[256];
        int port = 0;
        CHECK(sscanf(redis_url, "redis://%255[^:]:%d", host, &port) == 2, "url %s", redis_url);
        CHECK((rc = redisConnectWithTimeout(host, port, (struct timeval){5, 0})) && !rc->err,
              "redis %s", redis_url);
    }
    {
        int64_t until = sf_mono_ms() + 60000;
        int seen = 0;
        while (!seen && sf_mono_ms() < until) {
            redisReply *r = redisCommand(rc, "HGET " SF_RK_TEMPLATE " job", "tplreply", name);
            seen = r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, job_id);
            freeReplyObject(r);
            if (!seen)
                usleep(50000);
        }
        CHECK(seen, "the template create was not taken within 60 s");
    }
    /* 2. a job behind it on the same partition, answered: the forward is confirmed */
    produce_job(mark_id, "sandbox_list", json_object(), reply_now);
    CHECK(count_replies(reply_now, mark_id, 30000, &kind) >= 1, "the marker was not answered");
    printf("ok - the create was taken and forwarded; its answer cannot be delivered yet\n");

    /* 3. the scheduler stops (TERM), the topics go, a new one starts */
    CHECK((pid = scheduler_pid()) > 0, "no scheduler pid in %s/pids", state);
    CHECK(kill(pid, SIGTERM) == 0, "kill %d", pid);
    for (int i = 0; i < 600 && kill(pid, 0) == 0; i++)
        usleep(50000);
    CHECK(kill(pid, 0) != 0, "the scheduler did not stop within 30 s");
    unfill();
    snprintf(cmd, sizeof(cmd), "'%s/tests/integration/stack' restart-scheduler '%s' '%s'",
             SF_SOURCE_DIR, state, build);
    CHECK(system(cmd) == 0, "%s", cmd);
    printf("ok - the scheduler restarted\n");

    n = count_replies(reply_late, job_id, 60000, &kind);
    CHECK(n == 1, "sandbox_template_create was answered %d times after the restart (want "
          "once): its answer was %s", n, n ? "sent twice" : "lost with the stopped scheduler");
    CHECK(kind == SF_REPLY_RESULT, "the answer is not a result (kind %d)", kind);
    printf("ok - sandbox_template_create answered once, after the restart\n");
    redisFree(rc);
    rd_kafka_flush(producer, 5000);
    sf_kafka_producer_free(producer);
    return 0;
}
