/* kafka_find BROKERS TOPIC TOOL ARG VALUE [TIMEOUT_MS]: reads TOPIC from its beginning and
 * exits 0 as soon as it holds a job envelope whose tool is TOOL and whose args.ARG is the
 * string VALUE (printing its id, team, sandbox and reply topic), 1 when none came before
 * the timeout. The gateway suites use it to see what reached Kafka (e.g. an sf.cancel). */
#include "sf_codec.h"
#include "sf_kafka.h"
#include "sf_util.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    sf_kafka_settings s = {.fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512], group[SF_ID_MAX];
    rd_kafka_t *producer = NULL, *consumer = NULL;
    int64_t timeout = 15000, end;
    int found = 0;

    if (argc < 6 || (argc > 6 && sf_parse_i64(argv[6], 1, 600000, &timeout) < 0)) {
        fprintf(stderr, "usage: kafka_find BROKERS TOPIC TOOL ARG VALUE [TIMEOUT_MS]\n");
        return 2;
    }
    s.brokers = argv[1];
    sf_id_new(group, "find_");
    if (!(producer = sf_kafka_producer_new(&s, why, sizeof(why))) ||
        !(consumer = sf_kafka_consumer_new(&s, group, why, sizeof(why))) ||
        sf_kafka_assign_all(consumer, producer, argv[2], RD_KAFKA_OFFSET_BEGINNING, 5000) < 0) {
        fprintf(stderr, "kafka_find: cannot read %s: %s\n", argv[2], why);
        sf_kafka_consumer_free(consumer);
        sf_kafka_producer_free(producer);
        return 2;
    }
    end = sf_mono_ms() + timeout;
    while (!found && sf_mono_ms() < end) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 100);
        sf_job j;
        const char *w;

        if (!m)
            continue;
        if (!m->err && sf_job_decode(m->payload, m->len, &j, &w) == 0) {
            const char *v = json_string_value(json_object_get(j.args, argv[4]));
            if (!strcmp(j.tool, argv[3]) && v && !strcmp(v, argv[5])) {
                printf("id=%s team=%s sandbox=%s reply=%s\n", j.id, j.team, j.sandbox, j.reply);
                found = 1;
            }
            sf_job_fini(&j);
        }
        rd_kafka_message_destroy(m);
    }
    sf_kafka_consumer_free(consumer);
    sf_kafka_producer_free(producer);
    return found ? 0 : 1;
}
