/* kafka_tail BROKERS TOPIC [WAIT_MS]: prints every message of TOPIC from its beginning
 * up to the end each partition had when it started (its high watermark), one value per
 * line, then exits; gives up after WAIT_MS (default 15000) with what it read. The fault
 * suite reads sf.events with it. */
#include "sf_kafka.h"
#include "sf_util.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    sf_kafka_settings s = {.fetch_wait_ms = 5, .session_timeout_ms = 6000};
    char why[512] = "", group[SF_ID_MAX];
    rd_kafka_t *producer = NULL, *consumer = NULL;
    rd_kafka_topic_partition_list_t *asg = NULL;
    int64_t wait = 15000, until, end[256] = {0}, next[256] = {0};
    int np = 0, left = 0, rc = 1;

    if (argc < 3 || (argc > 3 && sf_parse_i64(argv[3], 1, 600000, &wait) < 0)) {
        fprintf(stderr, "usage: kafka_tail BROKERS TOPIC [WAIT_MS]\n");
        return 2;
    }
    until = sf_mono_ms() + wait;
    s.brokers = argv[1];
    sf_id_new(group, "tail_");
    if (!(producer = sf_kafka_producer_new(&s, why, sizeof(why))) ||
        !(consumer = sf_kafka_consumer_new(&s, group, why, sizeof(why))) ||
        sf_kafka_assign_all(consumer, producer, argv[2], RD_KAFKA_OFFSET_BEGINNING, 5000) < 0 ||
        rd_kafka_assignment(consumer, &asg) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kafka_tail: cannot read %s: %s\n", argv[2], why);
        goto out;
    }
    /* where each partition ends now: read up to there, not "until it went quiet" */
    np = asg->cnt < 256 ? asg->cnt : 256;
    for (int i = 0; i < np; i++) {
        int64_t lo = 0, hi = 0;
        int32_t p = asg->elems[i].partition;
        if (p < 0 || p >= 256 ||
            rd_kafka_query_watermark_offsets(consumer, argv[2], p, &lo, &hi, 5000) !=
                RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "kafka_tail: cannot read where %s[%d] ends\n", argv[2], (int)p);
            goto out;
        }
        end[p] = hi;
        next[p] = lo;
        if (lo < hi)
            left++;
    }
    while (left > 0 && sf_mono_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 100);
        if (!m)
            continue;
        if (!m->err && m->partition >= 0 && m->partition < 256 && m->offset < end[m->partition]) {
            printf("%.*s\n", (int)m->len, (const char *)m->payload);
            if (next[m->partition] < end[m->partition] && m->offset + 1 >= end[m->partition])
                left--;
            next[m->partition] = m->offset + 1;
        }
        rd_kafka_message_destroy(m);
    }
    if (left > 0)
        fprintf(stderr, "kafka_tail: %d partition(s) of %s not read to their end in %lld ms\n",
                left, argv[2], (long long)wait);
    rc = 0;
out:
    fflush(stdout);
    if (asg)
        rd_kafka_topic_partition_list_destroy(asg);
    sf_kafka_consumer_free(consumer);
    sf_kafka_producer_free(producer);
    return rc;
}
