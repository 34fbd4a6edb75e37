/* Jobs put on the queue by hand, as an attacker with Kafka access would (on the attack
 * stack: tests/attack/CMakeLists.txt): a batch job whose producer chose a 30-day deadline
 * has its guard kept for job_deadline_max_ms at most, not 30 days; a gateway-signed job
 * signed 20 minutes ago is refused as expired (a captured one cannot be put back); a job
 * put straight on a host's topic is refused unless the scheduler signed it for that host
 * within the hour. */
#include "check.h"
#include "sf_auth.h"
#include "sf_codec.h"
#include "sf_jobauth.h"
#include "sf_kafka.h"
#include "sf_redis.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEADLINE_MAX_S 3600 /* the worker's job_deadline_max_ms default */

static char brokers[2048], topic[SF_TOPIC_MAX], redis_url[1024], secret_file[4096];
static uint8_t secret[32], gw_key[32];
static rd_kafka_t *producer, *consumer;
static redisContext *rc;

static void read_env(void)
{
    char path[4096], line[1024];
    const char *state = getenv("SF_E2E_STATE");
    FILE *f;

    CHECK(state, "SF_E2E_STATE is not set (run through ctest)");
    snprintf(path, sizeof(path), "%s/env", state);
    CHECK((f = fopen(path, "r")), "cannot open %s", path);
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "SF_KAFKA_BROKERS=", 17))
            snprintf(brokers, sizeof(brokers), "%s", line + 17);
        else if (!strncmp(line, "SF_REDIS_URL=", 13))
            snprintf(redis_url, sizeof(redis_url), "%s", line + 13);
        else if (!strncmp(line, "SF_AUTH_SECRET_FILE=", 20))
            snprintf(secret_file, sizeof(secret_file), "%s", line + 20);
    }
    fclose(f);
    CHECK(brokers[0] && redis_url[0] && secret_file[0], "incomplete %s", path);
}

/* Waits for the reply to job id (30 s) and decodes it (the caller finis). */
static void await_reply(const char *id, sf_reply *out)
{
    int64_t until = sf_mono_ms() + 30000;

    while (sf_mono_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 100);
        const char *why;
        if (!m)
            continue;
        if (!m->err && sf_reply_decode(m->payload, m->len, out, &why) == 0) {
            if (!strcmp(out->id, id)) {
                rd_kafka_message_destroy(m);
                return;
            }
            sf_reply_fini(out);
        }
        rd_kafka_message_destroy(m);
    }
    CHECK(0, "no reply for %s within 30 s", id);
}

/* A job encoded as a gateway or batch producer would (team, tool, deadline). */
static void encode(sf_buf *b, const char *id, const char *team, const char *tool,
                   const char *sandbox, int64_t deadline_ms)
{
    sf_job j;

    sf_job_init(&j);
    snprintf(j.id, sizeof(j.id), "%s", id);
    snprintf(j.sandbox, sizeof(j.sandbox), "%s", sandbox ? sandbox : "");
    snprintf(j.team, sizeof(j.team), "%s", team);
    snprintf(j.tool, sizeof(j.tool), "%s", tool);
    snprintf(j.reply, sizeof(j.reply), "%s", topic);
    j.deadline_ms = deadline_ms;
    j.args = sandbox && strcmp(tool, "sandbox_create") ? json_pack("{s:s}", "sandbox_id", sandbox)
                                                          : json_object();
    sf_buf_init(b, SF_MSG_MAX);
    CHECK(sf_job_encode(&j, b) == 0, "encode");
    sf_job_fini(&j);
}

/* Produces p onto topic t signed as signer with key at iat (ms); signer NULL: unsigned. */
static void produce_as(const char *t, const sf_buf *b, const char *signer, const uint8_t key[32],
                       int64_t iat)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(3);
    uint8_t digest[32], mac[32];
    char iats[24], hex[65];

    crypto_hash_sha256(digest, (const uint8_t *)b->p, b->len);
    if (signer) {
        sf_jobauth_mac(key, signer, iat, digest, mac);
        sodium_bin2hex(hex, sizeof(hex), mac, sizeof(mac));
        snprintf(iats, sizeof(iats), "%" PRId64, iat);
        rd_kafka_header_add(h, SF_JOBAUTH_HDR_KEY, -1, signer, -1);
        rd_kafka_header_add(h, SF_JOBAUTH_HDR_IAT, -1, iats, -1);
        rd_kafka_header_add(h, SF_JOBAUTH_HDR_MAC, -1, hex, -1);
    }
    CHECK(rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(t), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_KEY("bounds", 6), RD_KAFKA_V_VALUE(b->p, b->len),
                            RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR,
          "producev");
    rd_kafka_flush(producer, 5000);
}

/* Produces p onto topic t signed as `gateway` at iat (ms). */
static void produce_signed_at(const char *t, const sf_buf *b, int64_t iat)
{
    produce_as(t, b, SF_JOBAUTH_GATEWAY, gw_key, iat);
}

/* A create put straight on the host's topic (as an attacker with Kafka access would) by
 * signer/key at iat is refused `unauthenticated` with a sentence holding `says`, and no
 * sandbox record for it exists. */
static void host_create_refused(const char *what, const char *signer, const uint8_t key[32],
                                int64_t iat, const char *says)
{
    char id[SF_ID_MAX], sb[SF_ID_MAX];
    redisReply *k;
    sf_reply r;
    sf_buf b;

    sf_id_new(id, "job_bh");
    sf_id_new(sb, "sb_bh");
    encode(&b, id, "boundsh", "sandbox_create", sb, sf_now_ms() + 30000);
    produce_as(SF_TOPIC_HOST_PREFIX "attack-host", &b, signer, key, iat);
    sf_buf_fini(&b);
    await_reply(id, &r);
    CHECK(r.kind == SF_REPLY_ERROR && !strcmp(r.code, SF_ERR_UNAUTH),
          "%s: the worker refuses it (%s: %s)", what, r.kind == SF_REPLY_ERROR ? r.code : "a result",
          r.message ? r.message : "");
    CHECK(r.message && strstr(r.message, says), "%s: the refusal says '%s': %s", what, says,
          r.message);
    k = redisCommand(rc, "KEYS *%s*", sb);
    CHECK(k && k->type == REDIS_REPLY_ARRAY && k->elements == 0,
          "%s: nothing of the sandbox was written (%zu keys)", what, k ? k->elements : 0);
    freeReplyObject(k);
    printf("ok - %s is refused: %s\n", what, r.message);
    sf_reply_fini(&r);
}

/* The longest TTL (s) of the job's guard under any key layout (sf:job:*<id>*), -2: none. */
static long long guard_ttl(const char *id)
{
    long long best = -2;
    redisReply *r = redisCommand(rc, "KEYS sf:job:*%s*", id);

    CHECK(r && r->type == REDIS_REPLY_ARRAY, "KEYS");
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *t = redisCommand(rc, "TTL %s", r->element[i]->str);
        CHECK(t && t->type == REDIS_REPLY_INTEGER, "TTL");
        if (t->integer > best)
            best = t->integer;
        freeReplyObject(t);
    }
    freeReplyObject(r);
    return best;
}

/* argv[1]: "deadline", "stale" or "host" runs that case alone (each fails on its own); none: both. */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    sf_kafka_settings s = {.fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512], rid[SF_ID_MAX], id[SF_ID_MAX], sb[SF_ID_MAX];
    long long ttl;
    sf_reply r;
    sf_buf b;

    read_env();
    s.brokers = brokers;
    CHECK(sf_auth_secret_load(secret_file, secret, why, sizeof(why)) == 0, "%s", why);
    sf_gateway_job_key(secret, gw_key);
    CHECK((rc = sf_redis_connect_sync(redis_url, why, sizeof(why))), "%s", why);
    sf_id_new(rid, "bq_");
    snprintf(topic, sizeof(topic), SF_TOPIC_REPLY_PREFIX "%s", rid);
    CHECK((producer = sf_kafka_producer_new(&s, why, sizeof(why))), "%s", why);
    CHECK((consumer = sf_kafka_consumer_new(&s, rid, why, sizeof(why))), "%s", why);
    CHECK(sf_kafka_assign_all(consumer, producer, topic, RD_KAFKA_OFFSET_BEGINNING, 5000) == 0,
          "assign %s", topic);
    rd_kafka_poll_set_consumer(consumer);

    /* 1. A producer's 30-day deadline on a create (a job the worker runs): its guard, and
     * the reply kept in it, live an hour + 60 s. */
    if (!*only || !strcmp(only, "deadline")) {
    sf_id_new(id, "job_bq");
    sf_id_new(sb, "sb_bq");
    encode(&b, id, "boundsq", "sandbox_create", sb, sf_now_ms() + 30LL * 86400 * 1000);
    produce_signed_at(SF_TOPIC_JOBS, &b, sf_now_ms());
    sf_buf_fini(&b);
    await_reply(id, &r);
    CHECK(r.kind == SF_REPLY_RESULT, "the create was answered: %s", r.message ? r.message : "");
    sf_reply_fini(&r);
    ttl = guard_ttl(id);
    CHECK(ttl > 0 && ttl <= DEADLINE_MAX_S + 60,
          "a 30-day deadline is capped: the guard is kept %lld s (at most %d)", ttl,
          DEADLINE_MAX_S + 60);
    printf("ok - a producer's 30-day deadline is capped (guard kept %lld s)\n", ttl);
    sf_id_new(id, "job_bq");
    encode(&b, id, "boundsq", "sandbox_kill", sb, sf_now_ms() + 30000);
    produce_signed_at(SF_TOPIC_JOBS, &b, sf_now_ms());
    sf_buf_fini(&b);
    await_reply(id, &r);
    CHECK(r.kind == SF_REPLY_RESULT, "the kill was answered: %s", r.message ? r.message : "");
    sf_reply_fini(&r);
    }

    /* 2. A gateway-signed job signed 20 minutes ago (a captured copy put back): refused. */
    if (!*only || !strcmp(only, "stale")) {
    sf_id_new(id, "job_bq");
    encode(&b, id, "boundsq", "sandbox_list", NULL, sf_now_ms() + 30000);
    produce_signed_at(SF_TOPIC_JOBS, &b, sf_now_ms() - 20 * 60 * 1000);
    sf_buf_fini(&b);
    await_reply(id, &r);
    CHECK(r.kind == SF_REPLY_ERROR && !strcmp(r.code, SF_ERR_UNAUTH),
          "a stale gateway-signed job is refused (%s: %s)", r.kind == SF_REPLY_ERROR ? r.code : "a result",
          r.message ? r.message : "");
    CHECK(strstr(r.message, "expired"), "the refusal says it expired: %s", r.message);
    printf("ok - a gateway-signed job signed 20 minutes ago is refused: %s\n", r.message);
    sf_reply_fini(&r);
    }

    /* 3. Jobs put straight on a host's topic: unsigned, signed with another key, or signed
     * by the scheduler's key for this host two hours ago: each refused, nothing created. */
    if (!*only || !strcmp(only, "host")) {
    uint8_t hk[32], other[32];
    sf_host_job_key(secret, "attack-host", hk);
    sf_host_job_key(secret, "another-host", other);
    host_create_refused("an unsigned create on sf.host.attack-host", NULL, NULL, 0, "not signed");
    host_create_refused("a create on the host topic signed as a gateway", SF_JOBAUTH_GATEWAY,
                        gw_key, sf_now_ms(), "not this host's scheduler's");
    host_create_refused("a create signed with another host's key", SF_JOBAUTH_SCHEDULER, other,
                        sf_now_ms(), "not this host's scheduler's");
    host_create_refused("a create signed by this host's key 2 hours ago", SF_JOBAUTH_SCHEDULER,
                        hk, sf_now_ms() - 2 * 3600 * 1000LL, "expired");
    }

    sf_kafka_consumer_free(consumer);
    sf_kafka_producer_free(producer);
    redisFree(rc);
    return 0;
}
