/* sandfleet-kafka: the embedded Kafka-protocol broker for one-box use and tests.
 * librdkafka's mock cluster (rdkafka_mock.h): in-memory, N brokers on loopback,
 * reached by real librdkafka clients over TCP. Not for production: point
 * SF_KAFKA_BROKERS at a real cluster there.
 *
 * Restarts: the mock cluster binds each broker to port 0 and has no setting for it, so
 * a restarted broker would come back on new ports that no running client knows. This
 * program supplies bind() itself (librdkafka's call resolves to the executable's
 * definition before libc's), so each broker listens on the port recorded by the previous
 * run (--ports-file): clients reconnect by themselves. The messages do not survive (the
 * cluster is in memory): gateways publish their in-flight jobs again.
 *
 * One broker by default: the mock cluster serves all its brokers from one thread, so more
 * of them add no capacity, only connections: each client would fetch from each broker
 * every fetch.wait.max.ms (idle load), and a producer's batch would be split per broker. */
#include "sf_log.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_BROKERS 9

/* Ports the brokers take in creation order (0: any); set before the cluster starts. */
static int want_port[MAX_BROKERS];
static atomic_int next_listener;

/* A port outside the kernel's ephemeral range (so no client connection holds it when a
 * restarted broker wants it back), free now; 0 when none is found. */
static int pick_port(void)
{
    int lo = 32768, hi = 60999, s, port;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    if (lo <= 12000)
        return 0;
    for (int tries = 0; tries < 64; tries++) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        uint32_t r = 0;
        if (sf_random(&r, sizeof(r)) < 0)
            return 0;
        port = 10000 + (int)(r % (uint32_t)(lo - 10000));
        sin.sin_port = htons((uint16_t)port);
        if ((s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return 0;
        if (syscall(SYS_bind, s, &sin, sizeof(sin)) == 0) {
            close(s);
            return port;
        }
        close(s);
    }
    return 0;
}

/* The mock cluster's listeners ask for port 0: each gets its recorded port instead
 * (SO_REUSEADDR is set by the caller; a port still held by a dying process is retried for
 * a few seconds). Every other bind is passed through. */
int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

    if (sa && len >= sizeof(*in) && sa->sa_family == AF_INET && in->sin_port == 0) {
        int i = atomic_fetch_add(&next_listener, 1);
        if (i < MAX_BROKERS && want_port[i] > 0) {
            struct sockaddr_in sin = *in;
            sin.sin_port = htons((uint16_t)want_port[i]);
            for (int tries = 0; tries < 100; tries++) {
                if (syscall(SYS_bind, fd, &sin, sizeof(sin)) == 0)
                    return 0;
                if (errno != EADDRINUSE)
                    break;
                usleep(50 * 1000);
            }
            sf_warn("msg=\"recorded port taken; this broker moves (restart the daemons to "
                    "find it)\" port=%d err=\"%s\"", want_port[i], strerror(errno));
        }
    }
    return (int)syscall(SYS_bind, fd, sa, len);
}

/* Ports from a previous bootstrap list ("127.0.0.1:P,127.0.0.1:P,..."); how many. */
static int read_ports(const char *path, int *ports, int max)
{
    char line[1024], *p, *colon;
    int n = 0;
    FILE *f = path ? fopen(path, "r") : NULL;

    if (!f)
        return 0;
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0';
    fclose(f);
    for (p = line; n < max && (colon = strchr(p, ':')); n++) {
        int64_t v;
        char *end = colon + 1 + strspn(colon + 1, "0123456789");
        char c = *end;
        *end = '\0';
        if (sf_parse_i64(colon + 1, 1, 65535, &v) < 0)
            return 0;
        ports[n] = (int)v;
        *end = c;
        p = end;
    }
    return n;
}

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
    const char *bootstrap_file = NULL, *ports_file = NULL;
    int64_t brokers = 1, partitions = 4;
    char errstr[512];
    rd_kafka_conf_t *conf;
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mc;
    const char *bs;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bootstrap-file") && i + 1 < argc)
            bootstrap_file = argv[++i];
        else if (!strcmp(argv[i], "--ports-file") && i + 1 < argc)
            ports_file = argv[++i];
        else if (!strcmp(argv[i], "--brokers") && i + 1 < argc &&
                 sf_parse_i64(argv[i + 1], 1, 9, &brokers) == 0)
            i++;
        else if (!strcmp(argv[i], "--partitions") && i + 1 < argc &&
                 sf_parse_i64(argv[i + 1], 1, 64, &partitions) == 0)
            i++;
        else {
            fprintf(stderr, "usage: %s [--bootstrap-file FILE] [--ports-file FILE] "
                            "[--brokers 1-9] [--partitions 1-64]\n"
                            "  --ports-file: listen on the ports it names (a previous run's "
                            "addresses), and record them there\n", argv[0]);
            return 2;
        }
    }
    sf_log_init("kafka", SF_LOG_INFO);
    if (ports_file) {
        int n = read_ports(ports_file, want_port, (int)brokers);
        for (int i = n; i < brokers; i++)
            want_port[i] = pick_port();
        if (n > 0)
            sf_info("msg=\"listening on the recorded ports\" file=%s", ports_file);
    }
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
    if ((ports_file && write_file(ports_file, bs) < 0) ||
        (bootstrap_file && write_file(bootstrap_file, bs) < 0)) {
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
