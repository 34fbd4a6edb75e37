/* The embedded broker (ops/kafka) driven by librdkafka, as every daemon drives it: produce
 * and consume, a consumer group that rebalances when a member joins and when one dies
 * (its partitions move within the session timeout), committed offsets, a Fetch that waits
 * is answered by new data (long-poll), topics created and deleted through the admin API, a
 * malformed request that closes only its own connection, and a broker killed and restarted
 * on the same port that the same clients find again by themselves.
 * Usage: test_broker PATH-TO-sandfleet-kafka */
#define CHECK_CLEANUP() stop_broker(SIGKILL) /* (stop_broker: below) */
#include "check.h"
#include "sf_kafka.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *broker_bin;
static char dir[256], bs_file[512], ports_file[512], log_file[512], brokers[256];
static pid_t broker_pid;

static void stop_broker(int sig)
{
    int st;
    if (broker_pid > 0) {
        kill(broker_pid, sig);
        waitpid(broker_pid, &st, 0);
        broker_pid = 0;
    }
}

static void start_broker(void)
{
    int64_t until = sf_mono_ms() + 10000;
    FILE *f;

    unlink(bs_file);
    broker_pid = fork();
    CHECK(broker_pid >= 0, "fork: %s", strerror(errno));
    if (broker_pid == 0) {
        int fd = open(log_file, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(broker_bin, broker_bin, "--bootstrap-file", bs_file, "--ports-file", ports_file,
              "--partitions", "4", (char *)NULL);
        _exit(127);
    }
    while (access(bs_file, F_OK) != 0) {
        CHECK(sf_mono_ms() < until, "the broker did not write %s within 10 s", bs_file);
        usleep(20 * 1000);
    }
    CHECK((f = fopen(bs_file, "r")) && fgets(brokers, sizeof(brokers), f), "read %s", bs_file);
    fclose(f);
    brokers[strcspn(brokers, "\n")] = 0;
}

static sf_kafka_settings settings;

static int delivered, delivery_failed;
static void on_delivered(void *arg, int err)
{
    if (err)
        delivery_failed++;
    else
        delivered++;
}

/* Produces ids [from, to) to topic as "m<id>" and waits for every delivery report. */
static void produce_range(rd_kafka_t *p, const char *topic, int from, int to)
{
    int64_t until = sf_mono_ms() + 30000;
    delivered = delivery_failed = 0;
    for (int i = from; i < to; i++) {
        char v[32], k[16];
        snprintf(v, sizeof(v), "m%d", i);
        snprintf(k, sizeof(k), "k%d", i);
        CHECK(sf_kafka_produce_cb(p, topic, k, v, strlen(v), on_delivered, NULL) == 0, "produce");
    }
    while (delivered + delivery_failed < to - from) {
        CHECK(sf_mono_ms() < until, "only %d of %d delivered", delivered, to - from);
        rd_kafka_poll(p, 50);
    }
    CHECK(delivery_failed == 0, "%d deliveries failed", delivery_failed);
}

/* seen[id] counts receptions; polls consumers until ids [from, to) all arrived. */
static int seen[4096];
static void consume_until(rd_kafka_t **cs, int nc, int from, int to, int timeout_ms)
{
    int64_t until = sf_mono_ms() + timeout_ms;
    int missing;

    for (;;) {
        missing = 0;
        for (int i = from; i < to; i++)
            missing += seen[i] == 0;
        if (!missing)
            return;
        CHECK(sf_mono_ms() < until, "%d of ids %d-%d never arrived", missing, from, to - 1);
        for (int c = 0; c < nc; c++) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(cs[c], 20);
            int id;
            if (!m)
                continue;
            if (!m->err && m->len < 16) {
                char v[16];
                memcpy(v, m->payload, m->len);
                v[m->len] = 0;
                if (sscanf(v, "m%d", &id) == 1 && id >= 0 && id < 4096) {
                    seen[id]++;
                    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
                    rd_kafka_topic_partition_list_add(l, rd_kafka_topic_name(m->rkt),
                                                      m->partition)->offset = m->offset + 1;
                    rd_kafka_offsets_store(cs[c], l);
                    rd_kafka_topic_partition_list_destroy(l);
                }
            }
            rd_kafka_message_destroy(m);
        }
    }
}

static int assigned(rd_kafka_t *c)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    int n = 0;
    if (rd_kafka_assignment(c, &l) == 0 && l) {
        n = l->cnt;
        rd_kafka_topic_partition_list_destroy(l);
    }
    return n;
}

/* Polls the consumers until their assignments are want[] (each of nc). */
static void wait_assignment(rd_kafka_t **cs, int nc, const int *want, int timeout_ms,
                            const char *what)
{
    int64_t until = sf_mono_ms() + timeout_ms;
    for (;;) {
        int ok = 1;
        for (int c = 0; c < nc; c++)
            ok &= assigned(cs[c]) == want[c];
        if (ok)
            return;
        CHECK(sf_mono_ms() < until, "%s: assignments %d/%d after %d ms", what, assigned(cs[0]),
              nc > 1 ? assigned(cs[1]) : -1, timeout_ms);
        for (int c = 0; c < nc; c++) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(cs[c], 20);
            if (m)
                rd_kafka_message_destroy(m); /* (none are produced meanwhile) */
        }
    }
}

static long broker_count(const char *key)
{
    char line[4096], pat[64];
    long v = -1;
    FILE *f = fopen(log_file, "r");
    snprintf(pat, sizeof(pat), " %s=", key);
    while (f && fgets(line, sizeof(line), f)) {
        char *p = strstr(line, pat);
        if (p && strstr(line, "broker counts"))
            v = strtol(p + strlen(pat), NULL, 10);
    }
    if (f)
        fclose(f);
    return v;
}

static void admin_topics(rd_kafka_t *p)
{
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new("t.admin", 3, 1, NULL, 0);
    rd_kafka_DeleteTopic_t *dt = rd_kafka_DeleteTopic_new("t.admin");
    rd_kafka_queue_t *q = rd_kafka_queue_new(p);
    const struct rd_kafka_metadata *md;
    rd_kafka_topic_t *rkt;
    rd_kafka_event_t *ev;

    rd_kafka_CreateTopics(p, &nt, 1, NULL, q);
    CHECK((ev = rd_kafka_queue_poll(q, 10000)), "no CreateTopics answer");
    {
        const rd_kafka_CreateTopics_result_t *res = rd_kafka_event_CreateTopics_result(ev);
        size_t n;
        const rd_kafka_topic_result_t **tr = rd_kafka_CreateTopics_result_topics(res, &n);
        CHECK(n == 1 && rd_kafka_topic_result_error(tr[0]) == 0, "CreateTopics: %s",
              n ? rd_kafka_err2str(rd_kafka_topic_result_error(tr[0])) : "no result");
    }
    rd_kafka_event_destroy(ev);
    rkt = rd_kafka_topic_new(p, "t.admin", NULL);
    CHECK(rd_kafka_metadata(p, 0, rkt, &md, 5000) == 0 && md->topic_cnt == 1 &&
              md->topics[0].partition_cnt == 3,
          "t.admin should have 3 partitions");
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_DeleteTopics(p, &dt, 1, NULL, q);
    CHECK((ev = rd_kafka_queue_poll(q, 10000)), "no DeleteTopics answer");
    {
        const rd_kafka_DeleteTopics_result_t *res = rd_kafka_event_DeleteTopics_result(ev);
        size_t n;
        const rd_kafka_topic_result_t **tr = rd_kafka_DeleteTopics_result_topics(res, &n);
        CHECK(n == 1 && rd_kafka_topic_result_error(tr[0]) == 0, "DeleteTopics: %s",
              n ? rd_kafka_err2str(rd_kafka_topic_result_error(tr[0])) : "no result");
    }
    rd_kafka_event_destroy(ev);
    CHECK(rd_kafka_metadata(p, 1, NULL, &md, 5000) == 0, "metadata");
    for (int i = 0; i < md->topic_cnt; i++)
        CHECK(strcmp(md->topics[i].topic, "t.admin") != 0, "t.admin still listed after delete");
    rd_kafka_metadata_destroy(md);
    rd_kafka_NewTopic_destroy(nt);
    rd_kafka_DeleteTopic_destroy(dt);
    rd_kafka_queue_destroy(q);
}

/* Garbage on a connection of its own: the broker closes it (reads EOF) and keeps serving. */
static void malformed(rd_kafka_t *p)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    const char *colon = strrchr(brokers, ':');
    /* a request claiming 2 GiB, then one whose ApiVersions array count lies */
    static const unsigned char huge[] = {0x7f, 0xff, 0xff, 0xff, 0, 18, 0, 0};
    static const unsigned char lie[] = {0, 0, 0, 14, 0, 3, 0, 4, 0, 0, 0, 1, 0, 0,
                                        0x7f, 0xff, 0xff, 0xff};
    const unsigned char *reqs[] = {huge, lie};
    size_t lens[] = {sizeof(huge), sizeof(lie)};
    const struct rd_kafka_metadata *md;

    sin.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    for (int i = 0; i < 2; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        char buf[64];
        struct timeval tv = {10, 0};
        CHECK(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0, "connect");
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        CHECK(write(fd, reqs[i], lens[i]) == (ssize_t)lens[i], "write");
        CHECK(read(fd, buf, sizeof(buf)) == 0, "malformed request %d: connection not closed", i);
        close(fd);
    }
    CHECK(rd_kafka_metadata(p, 1, NULL, &md, 5000) == 0, "the broker stopped serving");
    rd_kafka_metadata_destroy(md);
}

int main(int argc, char **argv)
{
    char why[512];
    rd_kafka_t *p, *c[2], *tail;
    char *cluster;
    int want[2];

    CHECK(argc == 2, "usage: test_broker PATH-TO-sandfleet-kafka");
    broker_bin = argv[1];
    snprintf(dir, sizeof(dir), "/tmp/sf-kbroker-XXXXXX");
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(bs_file, sizeof(bs_file), "%s/bootstrap", dir);
    snprintf(ports_file, sizeof(ports_file), "%s/ports", dir);
    snprintf(log_file, sizeof(log_file), "%s/broker.log", dir);
    signal(SIGPIPE, SIG_IGN);
    start_broker();
    settings = (sf_kafka_settings){.brokers = brokers, .fetch_wait_ms = 500,
                                   .session_timeout_ms = 3000};

    CHECK((p = sf_kafka_producer_new(&settings, why, sizeof(why))), "%s", why);
    produce_range(p, "t.basic", 0, 200);
    printf("ok produce: 200 messages delivered\n");

    CHECK((c[0] = sf_kafka_consumer_new(&settings, "g1", why, sizeof(why))), "%s", why);
    CHECK(sf_kafka_subscribe(c[0], "t.basic") == 0, "subscribe");
    consume_until(c, 1, 0, 200, 20000);
    CHECK(rd_kafka_commit(c[0], NULL, 0) == 0, "commit");
    printf("ok consume: one member of g1 got all 200, committed\n");

    CHECK((c[1] = sf_kafka_consumer_new(&settings, "g1", why, sizeof(why))), "%s", why);
    CHECK(sf_kafka_subscribe(c[1], "t.basic") == 0, "subscribe");
    want[0] = want[1] = 2;
    wait_assignment(c, 2, want, 20000, "second member joins");
    produce_range(p, "t.basic", 200, 300);
    consume_until(c, 2, 200, 300, 20000);
    for (int i = 0; i < 300; i++)
        CHECK(seen[i] == 1, "message %d seen %d times", i, seen[i]);
    printf("ok rebalance: 2+2 partitions, 100 more each seen once\n");

    /* long-poll: a consumer waiting in a 500 ms fetch gets new data before its wait ends */
    kill(broker_pid, SIGUSR1);
    produce_range(p, "t.basic", 300, 340);
    consume_until(c, 2, 300, 340, 20000);
    kill(broker_pid, SIGUSR1);
    {
        int64_t until = sf_mono_ms() + 5000;
        while (broker_count("fetch_woken_by_data") <= 0 && sf_mono_ms() < until)
            usleep(50 * 1000);
        CHECK(broker_count("fetch_woken_by_data") > 0, "no waiting fetch was answered by data");
    }
    printf("ok long-poll: waiting fetches answered when data arrived\n");

    /* a member that dies without leaving: its partitions move to the other */
    {
        void *hooks = rd_kafka_opaque(c[1]); /* sf_kafka's, freed as its consumer_free would */
        rd_kafka_destroy_flags(c[1], RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
        free(hooks);
    }
    want[0] = 4;
    wait_assignment(c, 1, want, 20000, "a member died");
    produce_range(p, "t.basic", 340, 400);
    consume_until(c, 1, 340, 400, 20000);
    printf("ok session expiry: the survivor took all 4 partitions\n");

    admin_topics(p);
    printf("ok CreateTopics/DeleteTopics\n");
    malformed(p);
    printf("ok malformed requests close their connection only\n");

    /* committed offsets: a new member of the group starts after what g1 committed */
    CHECK(rd_kafka_commit(c[0], NULL, 0) == 0, "commit");
    {
        int64_t committed = 0;
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
        for (int i = 0; i < 4; i++)
            rd_kafka_topic_partition_list_add(l, "t.basic", i);
        CHECK(rd_kafka_committed(c[0], l, 5000) == 0, "committed");
        for (int i = 0; i < 4; i++)
            committed += l->elems[i].offset > 0 ? l->elems[i].offset : 0;
        rd_kafka_topic_partition_list_destroy(l);
        CHECK(committed == 400, "committed offsets add to %lld, not 400", (long long)committed);
    }
    printf("ok committed offsets read back\n");

    /* restart on the same port: the same producer and consumer go on by themselves */
    CHECK((tail = sf_kafka_consumer_new(&settings, "tail", why, sizeof(why))), "%s", why);
    CHECK((cluster = rd_kafka_clusterid(p, 5000)), "no cluster id");
    stop_broker(SIGKILL);
    start_broker();
    produce_range(p, "t.basic", 1000, 1050);
    consume_until(c, 1, 1000, 1050, 30000);
    {
        /* a restarted broker is a new cluster (gateways publish their waiting jobs again) */
        char *now = rd_kafka_clusterid(p, 5000);
        CHECK(now && strcmp(now, cluster) != 0, "the cluster id did not change on restart");
        rd_kafka_mem_free(p, now);
        rd_kafka_mem_free(p, cluster);
    }
    printf("ok restart: the same clients produce and consume again, new cluster id\n");

    sf_kafka_consumer_free(tail);
    sf_kafka_consumer_free(c[0]);
    sf_kafka_producer_free(p);
    stop_broker(SIGTERM);
    CHECK(broker_count("produce") > 0, "no counts logged at exit");
    unlink(bs_file);
    unlink(ports_file);
    unlink(log_file);
    rmdir(dir);
    printf("ok all\n");
    return 0;
}
