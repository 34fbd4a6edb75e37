/* The queue as a batch producer sees it: jobs put straight on sf.jobs get answered,
 * and broken msgpack is dead-lettered with an error reply instead of being lost or
 * crashing anything; every job is signed (a gateway's credential for the first cases,
 * a producer key's in the last), and a job whose signature fails is answered
 * `unauthenticated` and dead-lettered. Runs against the e2e stack (SF_E2E_STATE/env). */
#include "check.h"
#include "sf_auth.h"
#include "sf_codec.h"
#include "sf_jobauth.h"
#include "sf_kafka.h"
#include "sf_mpjson.h"
#include "sf_redis.h"
#include "sf_store.h"

#include <inttypes.h>
#include <sodium.h>

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char brokers[2048], topic[SF_TOPIC_MAX], redis_url[1024], secret_file[4096];
/* the stack's default sandbox shape (its env file: SF_SANDBOX_SHAPE=memory,vcpu,disk) */
static long long shape_mem = -1, shape_vcpu = -1, shape_disk = -1;
static uint8_t secret[32], gw_key[32];
static rd_kafka_t *producer, *consumer;

static void read_env(void)
{
    char path[4096], line[1024];
    const char *state = getenv("SF_E2E_STATE");
    FILE *f;

    CHECK(state, "SF_E2E_STATE is not set (run through ctest)");
    snprintf(path, sizeof(path), "%s/env", state);
    CHECK((f = fopen(path, "r")), "cannot open %s", path);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "SF_KAFKA_BROKERS=", 17)) {
            snprintf(brokers, sizeof(brokers), "%s", line + 17);
            brokers[strcspn(brokers, "\n")] = 0;
        } else if (!strncmp(line, "SF_REDIS_URL=", 13)) {
            snprintf(redis_url, sizeof(redis_url), "%s", line + 13);
            redis_url[strcspn(redis_url, "\n")] = 0;
        } else if (!strncmp(line, "SF_SANDBOX_SHAPE=", 17)) {
            sscanf(line + 17, "%lld,%lld,%lld", &shape_mem, &shape_vcpu, &shape_disk);
        } else if (!strncmp(line, "SF_AUTH_SECRET_FILE=", 20)) {
            snprintf(secret_file, sizeof(secret_file), "%s", line + 20);
            secret_file[strcspn(secret_file, "\n")] = 0;
        }
    fclose(f);
    CHECK(brokers[0] && redis_url[0] && secret_file[0],
          "no SF_KAFKA_BROKERS, SF_REDIS_URL or SF_AUTH_SECRET_FILE in %s", path);
    CHECK(shape_mem > 0 && shape_vcpu > 0 && shape_disk > 0, "no SF_SANDBOX_SHAPE in %s", path);
}

/* Waits for the reply to job id; returns it decoded (caller finis) or fails the test. */
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

/* A job onto sf.jobs as a gateway puts it: signed with the gateways' credential. */
static int jobs_produce(const char *key, const void *p, size_t n)
{
    return sf_jobauth_produce(producer, SF_TOPIC_JOBS, key, p, n, SF_JOBAUTH_GATEWAY, gw_key);
}

static void produce_job(const char *id, const char *tool, json_t *args)
{
    sf_job j;
    sf_buf b;

    sf_job_init(&j);
    snprintf(j.id, sizeof(j.id), "%s", id);
    snprintf(j.team, sizeof(j.team), "batch");
    snprintf(j.tool, sizeof(j.tool), "%s", tool);
    snprintf(j.reply, sizeof(j.reply), "%s", topic);
    j.deadline_ms = sf_now_ms() + 30000;
    j.args = args;
    sf_buf_init(&b, SF_MSG_MAX);
    CHECK(sf_job_encode(&j, &b) == 0, "encode");
    CHECK(jobs_produce("batch", b.p, b.len) == 0, "produce");
    sf_buf_fini(&b);
    sf_job_fini(&j);
}

/* A job onto sf.jobs with the headers given (NULL: left out). */
static void produce_hdrs(const void *p, size_t n, const char *kid, const char *iat,
                         const char *mac)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(3);

    if (kid)
        rd_kafka_header_add(h, SF_JOBAUTH_HDR_KEY, -1, kid, -1);
    if (iat)
        rd_kafka_header_add(h, SF_JOBAUTH_HDR_IAT, -1, iat, -1);
    if (mac)
        rd_kafka_header_add(h, SF_JOBAUTH_HDR_MAC, -1, mac, -1);
    CHECK(rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(SF_TOPIC_JOBS),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY("p", 1),
                            RD_KAFKA_V_VALUE((void *)p, n), RD_KAFKA_V_HEADERS(h),
                            RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR, "producev");
}

/* A producer's signed message: the encoded job (team "intruder": the key's team must win)
 * in b, its sf-iat and sf-mac made by kid/psk at iat. */
static void signed_job(sf_buf *b, const char *id, const char *tool, json_t *args,
                       const char *sandbox, const char *kid, const uint8_t psk[32], int64_t iat,
                       char iat_text[24], char mac_hex[65])
{
    uint8_t digest[32], mac[32];
    sf_job j;

    sf_job_init(&j);
    snprintf(j.id, sizeof(j.id), "%s", id);
    snprintf(j.team, sizeof(j.team), "intruder");
    snprintf(j.tool, sizeof(j.tool), "%s", tool);
    snprintf(j.sandbox, sizeof(j.sandbox), "%s", sandbox ? sandbox : "");
    snprintf(j.reply, sizeof(j.reply), "%s", topic);
    j.deadline_ms = sf_now_ms() + 30000;
    j.args = args;
    sf_buf_reset(b);
    CHECK(sf_job_encode(&j, b) == 0, "encode");
    sf_job_fini(&j);
    crypto_hash_sha256(digest, (const uint8_t *)b->p, b->len);
    sf_jobauth_mac(psk, kid, iat, digest, mac);
    snprintf(iat_text, 24, "%" PRId64, iat);
    sodium_bin2hex(mac_hex, 65, mac, 32);
}

/* Awaits job id's answer: an `unauthenticated` error whose message holds want. */
static void await_refusal(const char *id, const char *want, const char *what)
{
    sf_reply r;

    await_reply(id, &r);
    CHECK(r.kind == SF_REPLY_ERROR && !strcmp(r.code, SF_ERR_UNAUTH) && strstr(r.message, want),
          "%s: %s %s", what, r.code, r.message ? r.message : "(a result)");
    printf("ok - %s: %s\n", what, r.message);
    sf_reply_fini(&r);
}

static int w(void *data, const char *p, size_t n)
{
    return sf_buf_append(data, p, n) < 0 ? -1 : 0;
}

int main(void)
{
    sf_kafka_settings s = {.brokers = brokers, .fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512], rid[SF_ID_MAX];
    sf_reply r;
    sf_buf b;
    msgpack_packer pk;

    read_env();
    CHECK(sf_auth_secret_load(secret_file, secret, why, sizeof(why)) == 0, "%s", why);
    sf_gateway_job_key(secret, gw_key);
    sf_id_new(rid, "qt_");
    snprintf(topic, sizeof(topic), SF_TOPIC_REPLY_PREFIX "%s", rid);
    CHECK((producer = sf_kafka_producer_new(&s, why, sizeof(why))), "%s", why);
    CHECK((consumer = sf_kafka_consumer_new(&s, rid, why, sizeof(why))), "%s", why);
    CHECK(sf_kafka_assign_all(consumer, producer, topic, RD_KAFKA_OFFSET_BEGINNING, 5000) == 0,
          "assign %s", topic);
    rd_kafka_poll_set_consumer(consumer);

    /* 1. Pure garbage: dead-lettered; nobody to answer, nothing must break. */
    CHECK(sf_kafka_produce(producer, SF_TOPIC_JOBS, "junk", "\xc1\xff\x00garbage", 10) == 0, "p");

    /* 2. A job whose id and reply are readable but whose args are not a map. */
    sf_buf_init(&b, 4096);
    msgpack_packer_init(&pk, &b, w);
    msgpack_pack_map(&pk, 7);
    sf_mp_pack_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    sf_mp_pack_kv_str(&pk, "id", "job_broken1");
    sf_mp_pack_kv_str(&pk, "team", "batch");
    sf_mp_pack_kv_str(&pk, "tool", "sandbox_list");
    sf_mp_pack_kv_str(&pk, "reply", topic);
    sf_mp_pack_str(&pk, "deadline");
    msgpack_pack_int64(&pk, sf_now_ms() + 30000);
    sf_mp_pack_kv_str(&pk, "args", "not a map");
    CHECK(jobs_produce("batch", b.p, b.len) == 0, "p");
    sf_buf_fini(&b);
    await_reply("job_broken1", &r);
    CHECK(r.kind == SF_REPLY_ERROR, "broken job answered with an error");
    CHECK(!strcmp(r.code, SF_ERR_INVALID), "code %s", r.code);
    CHECK(strstr(r.message, "'args' must be a map"), "message names the field: %s", r.message);
    printf("ok - broken msgpack job answered: %s\n", r.message);
    sf_reply_fini(&r);

    /* 3. Valid jobs from a batch producer are served like MCP calls. */
    produce_job("job_batch1", "sandbox_list", json_object());
    await_reply("job_batch1", &r);
    CHECK(r.kind == SF_REPLY_RESULT, "list answered: %s", r.message ? r.message : "");
    CHECK(json_is_array(json_object_get(r.result, "sandboxes")), "sandboxes array");
    printf("ok - batch sandbox_list answered\n");
    sf_reply_fini(&r);

    /* 4. Arguments are validated for batch producers too. */
    produce_job("job_batch2", "sandbox_exec", json_pack("{s:s, s:i}", "sandbox_id", "sb_x",
                                                        "command", 5));
    await_reply("job_batch2", &r);
    CHECK(r.kind == SF_REPLY_ERROR && strstr(r.message, "command"),
          "invalid args rejected naming the field: %s", r.message ? r.message : "");
    printf("ok - batch job with bad arguments rejected: %s\n", r.message);
    sf_reply_fini(&r);

    /* 5. A create reusing another team's sandbox id is refused, not answered "active". */
    {
        sf_job j;
        sf_buf b2;
        sf_job_init(&j);
        snprintf(j.id, sizeof(j.id), "job_mine");
        snprintf(j.team, sizeof(j.team), "batch");
        snprintf(j.tool, sizeof(j.tool), "sandbox_create");
        snprintf(j.sandbox, sizeof(j.sandbox), "sb_queuetest1");
        snprintf(j.reply, sizeof(j.reply), "%s", topic);
        j.deadline_ms = sf_now_ms() + 30000;
        j.args = json_object();
        sf_buf_init(&b2, SF_MSG_MAX);
        CHECK(sf_job_encode(&j, &b2) == 0, "encode");
        CHECK(jobs_produce(j.sandbox, b2.p, b2.len) == 0, "p");
        await_reply("job_mine", &r);
        CHECK(r.kind == SF_REPLY_RESULT, "create answered: %s", r.message ? r.message : "");
        sf_reply_fini(&r);
        snprintf(j.id, sizeof(j.id), "job_theirs");
        snprintf(j.team, sizeof(j.team), "intruder");
        sf_buf_reset(&b2);
        CHECK(sf_job_encode(&j, &b2) == 0, "encode");
        CHECK(jobs_produce(j.sandbox, b2.p, b2.len) == 0, "p");
        await_reply("job_theirs", &r);
        CHECK(r.kind == SF_REPLY_ERROR && strstr(r.message, "exists"), "conflict: %s",
              r.message ? r.message : "");
        printf("ok - a create reusing another team's id is refused\n");
        sf_reply_fini(&r);
        json_object_clear(j.args);
        snprintf(j.id, sizeof(j.id), "job_kill");
        snprintf(j.team, sizeof(j.team), "batch");
        snprintf(j.tool, sizeof(j.tool), "sandbox_kill");
        json_object_set_new(j.args, "sandbox_id", json_string("sb_queuetest1"));
        sf_buf_reset(&b2);
        CHECK(sf_job_encode(&j, &b2) == 0, "encode");
        CHECK(jobs_produce(j.sandbox, b2.p, b2.len) == 0, "p");
        await_reply("job_kill", &r);
        CHECK(r.kind == SF_REPLY_RESULT, "kill answered");
        sf_reply_fini(&r);
        sf_buf_fini(&b2);
        sf_job_fini(&j);
    }

    /* 7. A create reaches its host with the shape placement chose (args.limits, from the
     * scheduler's sandbox_* settings, the stack's SF_SANDBOX_SHAPE (memory, vCPU, disk); no
     * inodes: the worker's default); a producer cannot choose the shape itself. */
    {
        rd_kafka_t *hostc;
        char sid[SF_ID_MAX], gid[SF_ID_MAX];
        int found = 0;
        int64_t until;

        produce_job("job_shape0", "sandbox_create",
                    json_pack("{s:{s:i}}", "limits", "memory_mib", 999999));
        await_reply("job_shape0", &r);
        CHECK(r.kind == SF_REPLY_ERROR && strstr(r.message, "Unknown argument 'limits'"),
              "limits from a producer refused: %s", r.message ? r.message : "");
        sf_reply_fini(&r);

        sf_id_new(gid, "qh_");
        CHECK((hostc = sf_kafka_consumer_new(&s, gid, why, sizeof(why))), "%s", why);
        CHECK(sf_kafka_assign_all(hostc, producer, SF_TOPIC_HOST_PREFIX "e2e-host",
                                  RD_KAFKA_OFFSET_BEGINNING, 5000) == 0, "assign host topic");
        sf_id_new(sid, "sb_");
        {
            sf_job j;
            sf_buf b2;
            sf_job_init(&j);
            snprintf(j.id, sizeof(j.id), "job_shape1");
            snprintf(j.team, sizeof(j.team), "batch");
            snprintf(j.tool, sizeof(j.tool), "sandbox_create");
            snprintf(j.sandbox, sizeof(j.sandbox), "%s", sid);
            snprintf(j.reply, sizeof(j.reply), "%s", topic);
            j.deadline_ms = sf_now_ms() + 30000;
            j.args = json_object();
            sf_buf_init(&b2, SF_MSG_MAX);
            CHECK(sf_job_encode(&j, &b2) == 0, "encode");
            CHECK(jobs_produce(j.sandbox, b2.p, b2.len) == 0, "p");
            sf_buf_fini(&b2);
            sf_job_fini(&j);
        }
        until = sf_mono_ms() + 30000;
        while (!found && sf_mono_ms() < until) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(hostc, 100);
            sf_job fj;
            const char *jwhy;
            if (!m)
                continue;
            if (!m->err && sf_job_decode(m->payload, m->len, &fj, &jwhy) == 0) {
                if (!strcmp(fj.sandbox, sid)) {
                    json_t *l = json_object_get(fj.args, "limits");
                    CHECK(json_integer_value(json_object_get(l, "memory_mib")) == shape_mem &&
                              json_integer_value(json_object_get(l, "vcpu_milli")) == shape_vcpu &&
                              json_integer_value(json_object_get(l, "pids_max")) == 256 &&
                              json_integer_value(json_object_get(l, "disk_mib")) == shape_disk &&
                              !json_object_get(l, "inodes") && !strcmp(fj.host, "e2e-host"),
                          "the forwarded create carries the shape");
                    found = 1;
                }
                sf_job_fini(&fj);
            }
            rd_kafka_message_destroy(m);
        }
        CHECK(found, "the create reached sf.host.e2e-host within 30 s");
        sf_kafka_consumer_free(hostc);
        await_reply("job_shape1", &r);
        CHECK(r.kind == SF_REPLY_RESULT, "create answered");
        sf_reply_fini(&r);
        produce_job("job_shape2", "sandbox_kill", json_pack("{s:s}", "sandbox_id", sid));
        await_reply("job_shape2", &r);
        sf_reply_fini(&r);
        printf("ok - a create reaches its host with args.limits; producers cannot set them\n");
    }

    /* 6. An unknown tool. */
    produce_job("job_batch3", "sandbox_teleport", json_object());
    await_reply("job_batch3", &r);
    CHECK(r.kind == SF_REPLY_ERROR && strstr(r.message, "Unknown tool"), "unknown tool: %s",
          r.message ? r.message : "");
    printf("ok - unknown tool rejected\n");
    sf_reply_fini(&r);

    /* 8. Producer signatures (schemas/envelope.md): a job signed with an API key's
     * credential runs as the key's team whatever the envelope says; a bad MAC, an unknown
     * or revoked key, a replay, an expired or misnamed job, an unsigned job and a forged
     * gateway signature are each answered `unauthenticated` and dead-lettered. */
    {
        char key[SF_APIKEY_LEN + 1], other[SF_APIKEY_LEN + 1], pid[SF_PRODUCER_ID_LEN + 1];
        char opid[SF_PRODUCER_ID_LEN + 1], sealed[SF_PSK_SEALED_HEX], iat[24], mac[65];
        char id[SF_ID_MAX], sid[SF_ID_MAX], dead_id[SF_ID_MAX], gid[SF_ID_MAX];
        uint8_t psk[32], opsk[32];
        redisContext *rc;
        redisReply *rr;
        rd_kafka_t *deadc;
        sf_buf b3;
        int found = 0;
        int64_t until;

        CHECK(sf_apikey_new(key) == 0 && sf_producer_derive(key, pid, psk) == 0 &&
                  sf_psk_seal(secret, pid, psk, sealed) == 0, "a producer key");
        CHECK(sf_apikey_new(other) == 0 && sf_producer_derive(other, opid, opsk) == 0, "key 2");
        CHECK((rc = sf_redis_connect_sync(redis_url, why, sizeof(why))), "%s", why);
        rr = redisCommand(rc, "HSET " SF_RK_PRODUCER " team qtteam key x psk %s", pid, sealed);
        CHECK(rr && rr->type == REDIS_REPLY_INTEGER, "HSET producer");
        freeReplyObject(rr);
        sf_id_new(gid, "qd_");
        CHECK((deadc = sf_kafka_consumer_new(&s, gid, why, sizeof(why))), "%s", why);
        CHECK(sf_kafka_assign_all(deadc, producer, SF_TOPIC_DEAD, RD_KAFKA_OFFSET_END, 5000) == 0,
              "assign sf.dead");
        sf_buf_init(&b3, SF_MSG_MAX);

        /* signed: a create runs as the key's team (its record says so), not "intruder" */
        sf_id_new(sid, "sb_");
        snprintf(id, sizeof(id), "%s-create", pid);
        signed_job(&b3, id, "sandbox_create", json_object(), sid, pid, psk, sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_reply(id, &r);
        CHECK(r.kind == SF_REPLY_RESULT, "signed create answered: %s", r.message ? r.message : "");
        sf_reply_fini(&r);
        rr = redisCommand(rc, "HGET " SF_RK_SANDBOX " team", sid);
        CHECK(rr && rr->type == REDIS_REPLY_STRING && !strcmp(rr->str, "qtteam"),
              "the sandbox belongs to the key's team");
        freeReplyObject(rr);
        printf("ok - a signed job runs as its key's team\n");
        /* the same message again (another offset): a replay */
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_refusal(id, "replay", "a replayed job is refused");
        snprintf(id, sizeof(id), "%s-kill", pid);
        signed_job(&b3, id, "sandbox_kill", json_pack("{s:s}", "sandbox_id", sid), sid, pid, psk,
                   sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_reply(id, &r);
        CHECK(r.kind == SF_REPLY_RESULT, "signed kill answered: %s", r.message ? r.message : "");
        sf_reply_fini(&r);

        snprintf(id, sizeof(id), "%s-internal", pid); /* the platform's own tools: not theirs */
        signed_job(&b3, id, "sf.cancel", json_pack("{s:s}", "job", "job_x"), NULL, pid, psk,
                   sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_reply(id, &r);
        CHECK(r.kind == SF_REPLY_ERROR && strstr(r.message, "platform's own"),
              "an internal tool from a producer: %s", r.message ? r.message : "(a result)");
        sf_reply_fini(&r);
        printf("ok - a producer cannot call the platform's internal tools\n");

        snprintf(id, sizeof(id), "%s-badmac", pid);
        signed_job(&b3, id, "sandbox_list", json_object(), NULL, pid, psk, sf_now_ms(), iat, mac);
        mac[0] = mac[0] == '0' ? '1' : '0';
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_refusal(id, "HMAC", "a bad HMAC is refused");
        snprintf(dead_id, sizeof(dead_id), "%s", id);

        snprintf(id, sizeof(id), "%s-old", pid);
        signed_job(&b3, id, "sandbox_list", json_object(), NULL, pid, psk,
                   sf_now_ms() - SF_JOBAUTH_WINDOW_MS - 60000, iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_refusal(id, "expired", "an expired job is refused");

        snprintf(id, sizeof(id), "job_%s", pid);
        signed_job(&b3, id, "sandbox_list", json_object(), NULL, pid, psk, sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_refusal(id, "must start with its producer id", "a misnamed signed job is refused");

        snprintf(id, sizeof(id), "%s-unknown", opid);
        signed_job(&b3, id, "sandbox_list", json_object(), NULL, opid, opsk, sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, opid, iat, mac);
        await_refusal(id, "unknown or revoked", "an unknown key is refused");

        rr = redisCommand(rc, "DEL " SF_RK_PRODUCER, pid); /* what `keys revoke` does */
        freeReplyObject(rr);
        snprintf(id, sizeof(id), "%s-revoked", pid);
        signed_job(&b3, id, "sandbox_list", json_object(), NULL, pid, psk, sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, mac);
        await_refusal(id, "unknown or revoked", "a revoked key is refused");

        signed_job(&b3, "job_unsigned", "sandbox_list", json_object(), NULL, pid, psk,
                   sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, NULL, NULL, NULL);
        await_refusal("job_unsigned", "not signed", "an unsigned job is refused");

        signed_job(&b3, "job_forged", "sandbox_list", json_object(), NULL, SF_JOBAUTH_GATEWAY,
                   psk, sf_now_ms(), iat, mac);
        produce_hdrs(b3.p, b3.len, SF_JOBAUTH_GATEWAY, iat, mac);
        await_refusal("job_forged", "gateway", "a forged gateway signature is refused");

        signed_job(&b3, "job_nomac", "sandbox_list", json_object(), NULL, pid, psk, sf_now_ms(),
                   iat, mac);
        produce_hdrs(b3.p, b3.len, pid, iat, NULL);
        await_refusal("job_nomac", "sf-mac", "a job without its HMAC is refused");

        until = sf_mono_ms() + 30000;
        while (!found && sf_mono_ms() < until) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(deadc, 100);
            sf_job dj;
            const char *jwhy;
            if (!m)
                continue;
            if (!m->err && m->key_len == 15 && !memcmp(m->key, "unauthenticated", 15) &&
                sf_job_decode(m->payload, m->len, &dj, &jwhy) == 0) {
                found = !strcmp(dj.id, dead_id);
                sf_job_fini(&dj);
            }
            rd_kafka_message_destroy(m);
        }
        CHECK(found, "the refused job %s is on %s", dead_id, SF_TOPIC_DEAD);
        printf("ok - refused jobs are dead-lettered\n");
        sf_buf_fini(&b3);
        sf_kafka_consumer_free(deadc);
        redisFree(rc);
    }

    sf_kafka_consumer_free(consumer);
    sf_kafka_producer_free(producer);
    printf("7 passed, 0 failed\n");
    return 0;
}
