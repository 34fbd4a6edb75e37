/* sandfleet-kafka: the embedded Kafka-protocol broker for one box and tests: one node, in
 * memory, one thread, loopback by default. Production points SF_KAFKA_BROKERS at an Apache
 * Kafka cluster instead.
 *
 * Restarts: --ports-file records the port; a restarted broker listens on it again, so
 * running clients reconnect by themselves. The messages, groups and offsets do not survive
 * (gateways publish their in-flight jobs again; consumers rejoin their groups). */
#include "server.h"
#include "sf_log.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A port outside the kernel's ephemeral range (so no client connection holds it when a
 * restarted broker wants it back), free now; 0 when none is found. */
static int pick_port(const struct in_addr *addr)
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
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr = *addr};
        uint32_t r = 0;
        if (sf_random(&r, sizeof(r)) < 0)
            return 0;
        port = 10000 + (int)(r % (uint32_t)(lo - 10000));
        sin.sin_port = htons((uint16_t)port);
        if ((s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return 0;
        if (bind(s, (struct sockaddr *)&sin, sizeof(sin)) == 0) {
            close(s);
            return port;
        }
        close(s);
    }
    return 0;
}

/* The port of a previous bootstrap list ("127.0.0.1:P"), or 0. */
static int read_port(const char *path)
{
    char line[1024], *colon;
    int64_t v;
    FILE *f = path ? fopen(path, "r") : NULL;

    if (!f)
        return 0;
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0';
    fclose(f);
    line[strcspn(line, ",\n")] = '\0';
    if (!(colon = strrchr(line, ':')) || sf_parse_i64(colon + 1, 1, 65535, &v) < 0)
        return 0;
    return (int)v;
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

/* A listening socket on addr:*port (0: any; the port taken is written back). A port still
 * held by a dying broker is retried for a few seconds. -errno on failure. */
static int listen_on(const struct in_addr *addr, int *port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr = *addr,
                              .sin_port = htons((uint16_t)*port)};
    socklen_t sl = sizeof(sin);
    int one = 1, fd, err = 0;

    if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    for (int tries = 0; tries < 100; tries++) {
        if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0) {
            err = 0;
            break;
        }
        err = -errno;
        if (errno != EADDRINUSE)
            break;
        usleep(50 * 1000);
    }
    if (err < 0 || listen(fd, 512) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &sl) < 0) {
        err = err < 0 ? err : -errno;
        close(fd);
        return err;
    }
    *port = ntohs(sin.sin_port);
    return fd;
}

static void on_stop(evutil_socket_t sig, short what, void *arg)
{
    event_base_loopbreak(arg);
}

static void on_usr1(evutil_socket_t sig, short what, void *arg)
{
    kb_server_log_stats(arg);
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--bootstrap-file FILE] [--ports-file FILE] [--partitions 1-64]\n"
            "          [--listen ADDR] [--retain-mib 1-4096]\n"
            "  --ports-file: listen on the port it names (a previous run's address), and record\n"
            "                it there; --partitions: sf.jobs's partitions (others get 4);\n"
            "  --listen: the IPv4 address listened on and advertised (default 127.0.0.1);\n"
            "  --retain-mib: bytes kept per partition (default 64; the oldest go first).\n"
            "  SIGUSR1 logs the broker's request counts (also logged when it stops).\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    const char *bootstrap_file = NULL, *ports_file = NULL, *host = "127.0.0.1";
    int64_t partitions = 4, retain_mib = 64;
    struct in_addr addr;
    struct event_base *base = NULL;
    struct event *ev_term = NULL, *ev_int = NULL, *ev_usr1 = NULL;
    kb_server *srv = NULL;
    char bs[128];
    int port = 0, fd, rc = 1;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bootstrap-file") && i + 1 < argc)
            bootstrap_file = argv[++i];
        else if (!strcmp(argv[i], "--ports-file") && i + 1 < argc)
            ports_file = argv[++i];
        else if (!strcmp(argv[i], "--listen") && i + 1 < argc)
            host = argv[++i];
        else if (!strcmp(argv[i], "--partitions") && i + 1 < argc &&
                 sf_parse_i64(argv[i + 1], 1, 64, &partitions) == 0)
            i++;
        else if (!strcmp(argv[i], "--retain-mib") && i + 1 < argc &&
                 sf_parse_i64(argv[i + 1], 1, 4096, &retain_mib) == 0)
            i++;
        else
            return usage(argv[0]);
    }
    sf_log_init("kafka", SF_LOG_INFO);
    if (inet_pton(AF_INET, host, &addr) != 1) {
        fprintf(stderr, "--listen takes an IPv4 address such as 127.0.0.1, not '%s'.\n", host);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (ports_file && (port = read_port(ports_file)) > 0)
        sf_info("msg=\"listening on the recorded port\" file=%s port=%d", ports_file, port);
    else if (ports_file)
        port = pick_port(&addr);
    if ((fd = listen_on(&addr, &port)) < 0) {
        sf_error("msg=\"cannot listen; is another broker running on this port?\" addr=%s "
                 "port=%d err=\"%s\"", host, port, strerror(-fd));
        return 1;
    }
    if (!(base = event_base_new())) {
        close(fd);
        sf_error("msg=\"cannot create the event loop\"");
        return 1;
    }
    {
        kb_server_cfg cfg = {.host = host, .port = port, .partitions = (int32_t)partitions,
                             .auto_partitions = 4, .part_cap = (size_t)retain_mib << 20,
                             .max_request = 100u << 20};
        if (!(srv = kb_server_new(base, &cfg, fd))) {
            sf_error("msg=\"cannot start the broker\" err=\"%s\"", strerror(errno));
            goto out;
        }
    }
    snprintf(bs, sizeof(bs), "%s:%d", host, port);
    if ((ports_file && write_file(ports_file, bs) < 0) ||
        (bootstrap_file && write_file(bootstrap_file, bs) < 0)) {
        sf_error("msg=\"cannot write the bootstrap file\" path=%s",
                 bootstrap_file ? bootstrap_file : ports_file);
        goto out;
    }
    ev_term = evsignal_new(base, SIGTERM, on_stop, base);
    ev_int = evsignal_new(base, SIGINT, on_stop, base);
    ev_usr1 = evsignal_new(base, SIGUSR1, on_usr1, srv);
    if (!ev_term || !ev_int || !ev_usr1 || event_add(ev_term, NULL) < 0 ||
        event_add(ev_int, NULL) < 0 || event_add(ev_usr1, NULL) < 0) {
        sf_error("msg=\"cannot set the signal handlers\"");
        goto out;
    }
    printf("%s\n", bs);
    fflush(stdout);
    sf_info("msg=\"embedded Kafka-protocol broker up\" brokers=%s counts_on=SIGUSR1", bs);
    event_base_dispatch(base);
    sf_info("msg=\"stopping\"");
    kb_server_log_stats(srv);
    rc = 0;
out:
    if (ev_term)
        event_free(ev_term);
    if (ev_int)
        event_free(ev_int);
    if (ev_usr1)
        event_free(ev_usr1);
    kb_server_free(srv);
    event_base_free(base);
    return rc;
}
