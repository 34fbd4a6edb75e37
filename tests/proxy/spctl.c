/* sp_spctl: the test suites' hands on the secret-proxy, through the same APIs the worker
 * and the scheduler will use.
 *   spctl call SOCK JSON [NETNS_PATH]     control request (netns fd attached); prints the
 *                                         reply; exit 0 when it says ok
 *   spctl setup NETNS_PATH ETC_DIR CA     sp_netns_setup + sp_netns_write_files
 *   spctl netlog SANDBOX [LIMIT [VERDICT]] sf_netlog_args_check + sf_netlog_read_sync
 *   spctl secrets-list TEAM               sf_secrets_list (what secret_list will show)
 *   spctl dnsq SERVER NAME [TYPE]         one UDP DNS query; prints "rcode N" and each A
 *   spctl dnsflood SERVER SUFFIX COUNT    COUNT queries n<i>.SUFFIX; prints "answered N"
 *   spctl dnsbench SERVER NAME COUNT D    COUNT queries in turn (D 1: n<i>.NAME); p50/p90 us
 * Redis comes from SF_REDIS_URL. */
#include "client.h"
#include "netns.h"
#include "sf_netlog.h"
#include "sf_redis.h"
#include "sf_secrets.h"
#include "sf_store.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

static int print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT);
    printf("%s\n", s ? s : "null");
    free(s);
    return 0;
}

static int call(int argc, char **argv)
{
    json_error_t jerr;
    json_t *req = json_loads(argv[3], 0, &jerr), *reply = NULL;
    char why[512];
    int fd = argc > 4 ? open(argv[4], O_RDONLY | O_CLOEXEC) : -1, rc, ok;

    if (!req || (argc > 4 && fd < 0)) {
        fprintf(stderr, "spctl: bad JSON or netns path\n");
        return 2;
    }
    rc = sp_client_call(argv[2], req, fd, 10000, &reply, why, sizeof(why));
    json_decref(req);
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        fprintf(stderr, "spctl: %s\n", why);
        return 2;
    }
    print_json(reply);
    ok = json_is_true(json_object_get(reply, "ok"));
    json_decref(reply);
    return ok ? 0 : 1;
}

static int setup(char **argv)
{
    sp_netns_opts o = {.transparent_port = 3129, .dns_port = 53, .http_port = 3128};
    char why[512];
    int fd = open(argv[2], O_RDONLY | O_CLOEXEC);

    if (fd < 0 || sp_netns_setup(fd, &o, why, sizeof(why)) < 0 ||
        sp_netns_write_files(argv[3], argv[4], why, sizeof(why)) < 0) {
        fprintf(stderr, "spctl: %s\n", fd < 0 ? "cannot open the netns" : why);
        return 1;
    }
    close(fd);
    return 0;
}

static redisContext *redis(void)
{
    char why[256];
    const char *url = getenv("SF_REDIS_URL");
    redisContext *c = sf_redis_connect_sync(url ? url : "redis://127.0.0.1:6379", why, sizeof(why));

    if (!c)
        fprintf(stderr, "spctl: %s\n", why);
    return c;
}

static int netlog(int argc, char **argv)
{
    int64_t limit = 0;
    int lim;
    char why[256];
    json_t *out;
    redisContext *c;

    if (argc > 3 && sf_parse_i64(argv[3], -1000, 100000, &limit) < 0)
        return 2;
    if (sf_netlog_args_check(limit, argc > 4 ? argv[4] : NULL, &lim, why, sizeof(why)) < 0) {
        printf("error: %s\n", why);
        return 1;
    }
    if (!(c = redis()))
        return 2;
    if (sf_netlog_read_sync(c, argv[2], lim, argc > 4 ? argv[4] : NULL, &out) < 0) {
        redisFree(c);
        return 1;
    }
    print_json(out);
    json_decref(out);
    redisFree(c);
    return 0;
}

static int secrets_list(char **argv)
{
    char why[256];
    json_t *out;
    redisContext *c = redis();

    if (!c)
        return 2;
    if (sf_secrets_list(c, argv[2], &out, why, sizeof(why)) < 0) {
        fprintf(stderr, "spctl: %s\n", why);
        redisFree(c);
        return 1;
    }
    print_json(out);
    json_decref(out);
    redisFree(c);
    return 0;
}

static int dnsq(int argc, char **argv)
{
    uint8_t q[300] = {0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}, r[600];
    size_t off = 12;
    const char *name = argv[3], *p = name;
    int type = argc > 4 ? atoi(argv[4]) : 1, fd;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    struct pollfd pfd;
    ssize_t n;

    while (*p) {
        size_t l = strcspn(p, ".");
        if (l == 0 || l > 63 || off + l + 6 > sizeof(q))
            return 2;
        q[off++] = (uint8_t)l;
        memcpy(q + off, p, l);
        off += l;
        p += l;
        if (*p == '.')
            p++;
    }
    q[off++] = 0;
    q[off++] = 0;
    q[off++] = (uint8_t)type;
    q[off++] = 0;
    q[off++] = 1;
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    if ((fd = socket(AF_INET, SOCK_DGRAM, 0)) < 0 ||
        sendto(fd, q, off, 0, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("spctl: send");
        return 3;
    }
    pfd.fd = fd;
    pfd.events = POLLIN;
    if (poll(&pfd, 1, 3000) <= 0 || (n = recv(fd, r, sizeof(r), 0)) < 12) {
        printf("timeout\n");
        return 4;
    }
    printf("rcode %d\n", r[3] & 0x0f);
    for (size_t i = off; i + 16 <= (size_t)n; i += 16)
        if (r[i + 3] == 1 && r[i + 11] == 4)
            printf("A %d.%d.%d.%d\n", r[i + 12], r[i + 13], r[i + 14], r[i + 15]);
    close(fd);
    return 0;
}

/* dnsflood SERVER SUFFIX COUNT: queries n0.SUFFIX .. n<COUNT-1>.SUFFIX (A), 16 in flight
 * at a time (a batch waits up to 2 s for its answers); prints "answered N". */
static int dnsflood(char **argv)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    long count = strtol(argv[4], NULL, 10), answered = 0;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);

    inet_pton(AF_INET, argv[2], &a.sin_addr);
    if (fd < 0 || count <= 0)
        return 2;
    for (long base = 0; base < count; base += 16) {
        int want = 0;
        for (long i = base; i < base + 16 && i < count; i++, want++) {
            uint8_t q[300] = {(uint8_t)(i >> 8), (uint8_t)i, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
            char name[256];
            size_t off = 12;
            const char *p = name;
            snprintf(name, sizeof(name), "n%ld.%s", i, argv[3]);
            while (*p) {
                size_t l = strcspn(p, ".");
                if (l == 0 || l > 63 || off + l + 6 > sizeof(q))
                    return 2;
                q[off++] = (uint8_t)l;
                memcpy(q + off, p, l);
                off += l;
                p += l + (p[l] == '.');
            }
            memcpy(q + off, "\0\0\1\0\1", 5);
            sendto(fd, q, off + 5, 0, (struct sockaddr *)&a, sizeof(a));
        }
        while (want > 0) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            uint8_t r[600];
            if (poll(&pfd, 1, 2000) <= 0)
                break;
            if (recv(fd, r, sizeof(r), 0) >= 12) {
                answered++;
                want--;
            }
        }
    }
    printf("answered %ld\n", answered);
    close(fd);
    return 0;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

/* dnsbench SERVER NAME COUNT DISTINCT: COUNT A queries one after another (for NAME, or
 * with DISTINCT 1 for n<i>.NAME, each a new name); prints "p50_us N p90_us N lost N". */
static int dnsbench(char **argv)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    long count = strtol(argv[4], NULL, 10), got = 0, lost = 0, *us;
    int distinct = atoi(argv[5]), fd = socket(AF_INET, SOCK_DGRAM, 0);

    inet_pton(AF_INET, argv[2], &a.sin_addr);
    if (fd < 0 || count <= 0 || !(us = calloc((size_t)count, sizeof(long))))
        return 2;
    for (long i = 0; i < count; i++) {
        uint8_t q[300] = {(uint8_t)(i >> 8), (uint8_t)i, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}, r[600];
        char name[256];
        size_t off = 12;
        const char *p = name;
        struct timespec t0, t1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (distinct)
            snprintf(name, sizeof(name), "n%ld.%s", i, argv[3]);
        else
            snprintf(name, sizeof(name), "%s", argv[3]);
        while (*p) {
            size_t l = strcspn(p, ".");
            if (l == 0 || l > 63 || off + l + 6 > sizeof(q))
                return 2;
            q[off++] = (uint8_t)l;
            memcpy(q + off, p, l);
            off += l;
            p += l + (p[l] == '.');
        }
        memcpy(q + off, "\0\0\1\0\1", 5);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        sendto(fd, q, off + 5, 0, (struct sockaddr *)&a, sizeof(a));
        if (poll(&pfd, 1, 2000) <= 0 || recv(fd, r, sizeof(r), 0) < 12) {
            lost++;
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        us[got++] = (t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000;
    }
    qsort(us, (size_t)got, sizeof(long), cmp_long);
    printf("p50_us %ld p90_us %ld lost %ld\n", got ? us[got / 2] : -1,
           got ? us[got * 9 / 10] : -1, lost);
    free(us);
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "dnsbench"))
        return dnsbench(argv);
    if (argc == 5 && !strcmp(argv[1], "dnsflood"))
        return dnsflood(argv);
    if (argc >= 4 && !strcmp(argv[1], "call"))
        return call(argc, argv);
    if (argc == 5 && !strcmp(argv[1], "setup"))
        return setup(argv);
    if (argc >= 3 && !strcmp(argv[1], "netlog"))
        return netlog(argc, argv);
    if (argc == 3 && !strcmp(argv[1], "secrets-list"))
        return secrets_list(argv);
    if (argc >= 4 && !strcmp(argv[1], "dnsq"))
        return dnsq(argc, argv);
    fprintf(stderr, "usage: see tests/proxy/spctl.c\n");
    return 2;
}
