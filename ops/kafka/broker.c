/* sandfleet-kafka: the embedded Kafka-protocol broker for one-box use and tests.
 * librdkafka's mock cluster (rdkafka_mock.h): in-memory, N brokers on loopback,
 * reached by real librdkafka clients over TCP. Not for production: point
 * SF_KAFKA_BROKERS at a real cluster there. */
#include "sf_log.h"
#include "sf_util.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    stop = 1;
}

static int write_file(const char *path, const char *text)
{
    char tmp[4096];
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp) || !(f = fopen(tmp, "w")))
        return -1;
    fprintf(f, "%s\n", text);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

int main(int argc, char **argv)
{
    const char *bootstrap_file = NULL;
    int64_t brokers = 3, partitions = 4;
    char errstr[512];
    rd_kafka_conf_t *conf;
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mc;
    const char *bs;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bootstrap-file") && i + 1 < argc)
            bootstrap_file = argv[++i];
        else if (!strcmp(argv[i], "--brokers") && i + 1 < argc &&
                 sf_parse_i64(argv[i + 1], 1, 9, &brokers) == 0)
            i++;
        else if (!strcmp(argv[i], "--partitions") && i + 1 < argc &&
                 sf_parse_i64(argv[i + 1], 1, 64, &partitions) == 0)
            i++;
        else {
            fprintf(stderr, "usage: %s [--bootstrap-file FILE] [--brokers 1-9] "
                            "[--partitions 1-64]\n", argv[0]);
            return 2;
        }
    }
    sf_log_init("kafka", SF_LOG_INFO);
    conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof(errstr));
    if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr)))) {
        sf_error("msg=\"cannot create the mock cluster's handle\" err=\"%s\"", errstr);
        return 1;
    }
    if (!(mc = rd_kafka_mock_cluster_new(rk, (int)brokers))) {
        sf_error("msg=\"cannot create the mock cluster\"");
        rd_kafka_destroy(rk);
        return 1;
    }
    /* The job topic is created up front; reply and host topics are created by the
     * first producer metadata request that names them. */
    rd_kafka_mock_topic_create(mc, "sf.jobs", (int)partitions, (int)(brokers < 3 ? brokers : 3));
    rd_kafka_mock_topic_create(mc, "sf.dead", 1, (int)(brokers < 3 ? brokers : 3));
    bs = rd_kafka_mock_cluster_bootstraps(mc);
    if (bootstrap_file && write_file(bootstrap_file, bs) < 0) {
        sf_error("msg=\"cannot write the bootstrap file\" path=%s", bootstrap_file);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
        return 1;
    }
    printf("%s\n", bs);
    fflush(stdout);
    sf_info("msg=\"embedded Kafka-protocol broker up\" brokers=%s", bs);

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!stop)
        pause();
    sf_info("msg=\"stopping\"");
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}
