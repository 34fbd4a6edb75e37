/* kafka_try produce TOPIC | read TOPIC GROUP: one attempt, as the Kafka user of the SF_KAFKA_* settings
 * (the daemons' own: SF_KAFKA_BROKERS, SF_KAFKA_SECURITY_PROTOCOL, SF_KAFKA_SASL_*), to
 * write one message to TOPIC or to read it (its first message, if any) as a member of
 * consumer group GROUP (the role's own: a group the ACLs refuse fails the read too). Prints "ok ..." and
 * exits 0 when Kafka allowed it; prints librdkafka's error name (TOPIC_AUTHORIZATION_FAILED,
 * ...) and exits 1 when it refused; 2 for a usage or set-up error. engines.acl's attacks. */
#include "sf_daemon.h"
#include "sf_kafka.h"
#include "sf_util.h"

#include <stdio.h>
#include <string.h>

static rd_kafka_resp_err_t delivered = RD_KAFKA_RESP_ERR__IN_PROGRESS;

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    delivered = m->err;
}

static int try_produce(const sf_kafka_settings *s, const char *topic)
{
    char why[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_t *rk;
    int64_t until = sf_mono_ms() + 20000;

    /* a plain producer, so the delivery report's error code is seen as it is */
    if ((s->security_protocol &&
         (rd_kafka_conf_set(c, "security.protocol", s->security_protocol, why, sizeof(why)) ||
          rd_kafka_conf_set(c, "sasl.mechanism", s->sasl_mechanism, why, sizeof(why)) ||
          rd_kafka_conf_set(c, "sasl.username", s->sasl_username, why, sizeof(why)) ||
          rd_kafka_conf_set(c, "sasl.password", s->sasl_password, why, sizeof(why)))) ||
        rd_kafka_conf_set(c, "bootstrap.servers", s->brokers, why, sizeof(why)) ||
        rd_kafka_conf_set(c, "message.timeout.ms", "15000", why, sizeof(why))) {
        fprintf(stderr, "kafka_try: %s\n", why);
        rd_kafka_conf_destroy(c);
        return 2;
    }
    rd_kafka_conf_set_dr_msg_cb(c, on_dr);
    if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, why, sizeof(why)))) {
        fprintf(stderr, "kafka_try: %s\n", why);
        rd_kafka_conf_destroy(c);
        return 2;
    }
    if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                          RD_KAFKA_V_KEY("kafka_try", 9),
                          RD_KAFKA_V_VALUE("not a job: engines.acl", 22), RD_KAFKA_V_END)) {
        fprintf(stderr, "kafka_try: cannot queue the message\n");
        rd_kafka_destroy(rk);
        return 2;
    }
    while (delivered == RD_KAFKA_RESP_ERR__IN_PROGRESS && sf_mono_ms() < until)
        rd_kafka_poll(rk, 100);
    rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_poll(rk, 0);
    rd_kafka_destroy(rk);
    if (delivered == RD_KAFKA_RESP_ERR_NO_ERROR) {
        printf("ok wrote 1 message to %s\n", topic);
        return 0;
    }
    printf("%s\n", rd_kafka_err2name(delivered));
    return 1;
}

/* The topic's partition count from a Metadata request: a principal without DESCRIBE (READ
 * implies it) is told TOPIC_AUTHORIZATION_FAILED there, before any fetch. */
static rd_kafka_resp_err_t partitions(rd_kafka_t *rk, const char *topic, int *n, int64_t until)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;

    while (rkt && sf_mono_ms() < until) {
        const struct rd_kafka_metadata *md = NULL;
        err = rd_kafka_metadata(rk, 0, rkt, &md, 5000);
        if (!err && md->topic_cnt == 1) {
            err = md->topics[0].err;
            *n = md->topics[0].partition_cnt;
        }
        if (md)
            rd_kafka_metadata_destroy(md);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
            break;
        rd_kafka_poll(rk, 200);
    }
    if (rkt)
        rd_kafka_topic_destroy(rkt);
    return err;
}

static int try_read(const sf_kafka_settings *s, const char *topic, const char *group)
{
    char why[512];
    rd_kafka_t *rk;
    rd_kafka_topic_partition_list_t *l;
    rd_kafka_resp_err_t err;
    int64_t lo, hi, until = sf_mono_ms() + 15000;
    int n = 0, rc = 1, full = 0;

    if (!(rk = sf_kafka_consumer_new(s, group, why, sizeof(why)))) {
        fprintf(stderr, "kafka_try: %s\n", why);
        return 2;
    }
    if ((err = partitions(rk, topic, &n, until))) {
        printf("%s\n", rd_kafka_err2name(err));
        goto out;
    }
    l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) {
        if ((err = rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi, 5000))) {
            printf("%s\n", rd_kafka_err2name(err));
            rd_kafka_topic_partition_list_destroy(l);
            goto out;
        }
        if (hi > lo) {
            rd_kafka_topic_partition_list_add(l, topic, i)->offset = lo;
            full++;
        }
    }
    if (!full) {
        printf("ok %s is readable (empty)\n", topic);
        rd_kafka_topic_partition_list_destroy(l);
        rc = 0;
        goto out;
    }
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    while (sf_mono_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        err = m->err;
        rd_kafka_message_destroy(m);
        if (err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
            continue;
        if (err)
            printf("%s\n", rd_kafka_err2name(err));
        else
            printf("ok read a message of %s\n", topic);
        rc = err ? 1 : 0;
        goto out;
    }
    printf("TIMED_OUT\n");
out:
    sf_kafka_consumer_free(rk);
    return rc;
}

int main(int argc, char **argv)
{
    sf_common_cfg c;
    sf_kafka_settings s = {.fetch_wait_ms = 100, .session_timeout_ms = 6000};
    char why[512];
    int rc;

    if (!(argc == 3 && !strcmp(argv[1], "produce")) && !(argc == 4 && !strcmp(argv[1], "read"))) {
        fprintf(stderr, "usage: kafka_try produce TOPIC | read TOPIC GROUP\n");
        return 2;
    }
    if (sf_common_config_load(&c, why, sizeof(why)) < 0 ||
        sf_kafka_security_set(&s, c.kafka_security_protocol, c.kafka_sasl_mechanism,
                              c.kafka_sasl_username, c.kafka_sasl_password_file, why,
                              sizeof(why)) < 0) {
        fprintf(stderr, "kafka_try: %s\n", why);
        return 2;
    }
    s.brokers = c.kafka_brokers;
    rc = !strcmp(argv[1], "produce") ? try_produce(&s, argv[2]) : try_read(&s, argv[2], argv[3]);
    sf_common_config_free(&c);
    return rc;
}
