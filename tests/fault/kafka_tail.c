/* kafka_tail BROKERS TOPIC [QUIET_MS]: prints every message of TOPIC from its beginning,
 * one value per line, and exits once nothing new came for QUIET_MS (default 1500). The
 * fault suite reads sf.events with it. */
#include "sf_kafka.h"
#include "sf_util.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    sf_kafka_settings s = {.fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512], group[SF_ID_MAX];
    rd_kafka_t *producer = NULL, *consumer = NULL;
    int64_t quiet = 1500, last;
    int rc = 1;

    if (argc < 3 || (argc > 3 && sf_parse_i64(argv[3], 1, 600000, &quiet) < 0)) {
        fprintf(stderr, "usage: kafka_tail BROKERS TOPIC [QUIET_MS]\n");
        return 2;
    }
    s.brokers = argv[1];
    sf_id_new(group, "tail_");
    if (!(producer = sf_kafka_producer_new(&s, why, sizeof(why))) ||
        !(consumer = sf_kafka_consumer_new(&s, group, why, sizeof(why))) ||
        sf_kafka_assign_all(consumer, producer, argv[2], RD_KAFKA_OFFSET_BEGINNING, 5000) < 0) {
        fprintf(stderr, "kafka_tail: cannot read %s: %s\n", argv[2], why);
        goto out;
    }
    last = sf_mono_ms();
    while (sf_mono_ms() - last < quiet) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 100);
        if (!m)
            continue;
        if (!m->err) {
            printf("%.*s\n", (int)m->len, (const char *)m->payload);
            last = sf_mono_ms();
        }
        rd_kafka_message_destroy(m);
    }
    rc = 0;
out:
    fflush(stdout);
    sf_kafka_consumer_free(consumer);
    sf_kafka_producer_free(producer);
    return rc;
}
