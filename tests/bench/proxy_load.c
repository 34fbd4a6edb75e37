/* sp_load: a small HTTP/1.1 load generator for tests/bench/proxy. C keep-alive
 * connections (threads, blocking sockets, optional TLS without verification) send N
 * GET requests in all and read each response (Content-Length framing); prints one line:
 * "rps=.. p50_us=.. p90_us=.. p99_us=.. cpu_us=.. errors=.." (cpu_us: this process's own CPU
 * time per request, user + system). HOSTNAME "http://NAME" sends the
 * requests in absolute form (GET http://NAME/bench, Host: NAME), as to an HTTP proxy.
 *   sp_load IP PORT HOSTNAME CONNS N [tls] [HEADER] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct worker {
    pthread_t t;
    int n;
    long *lat_us;
    int done, errors;
} worker;

static struct sockaddr_in addr;
static const char *host, *header, *target = "/bench"; /* target: absolute form to a proxy */
static int use_tls;
static SSL_CTX *ctx;

static long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

typedef struct conn {
    int fd;
    SSL *ssl;
} conn;

static int c_open(conn *c)
{
    int one = 1;

    c->ssl = NULL;
    if ((c->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        return -1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (use_tls) {
        c->ssl = SSL_new(ctx);
        SSL_set_tlsext_host_name(c->ssl, host);
        SSL_set_fd(c->ssl, c->fd);
        if (SSL_connect(c->ssl) != 1)
            return -1;
    }
    return 0;
}

static void c_close(conn *c)
{
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd);
}

static int c_write(conn *c, const char *p, int n)
{
    return c->ssl ? SSL_write(c->ssl, p, n) : (int)send(c->fd, p, (size_t)n, MSG_NOSIGNAL);
}

static int c_read(conn *c, char *p, int n)
{
    return c->ssl ? SSL_read(c->ssl, p, n) : (int)recv(c->fd, p, (size_t)n, 0);
}

/* Reads one response; 0 or -1. */
static int response(conn *c, char *buf, int cap)
{
    int len = 0, r;
    char *end, *cl;
    long want;

    for (;;) {
        if (len == cap - 1 || (r = c_read(c, buf + len, cap - 1 - len)) <= 0)
            return -1;
        len += r;
        buf[len] = '\0';
        if ((end = strstr(buf, "\r\n\r\n")))
            break;
    }
    cl = strcasestr(buf, "\r\ncontent-length:");
    want = (end - buf) + 4 + (cl ? strtol(cl + 17, NULL, 10) : 0);
    while (len < want) {
        if ((r = c_read(c, buf + len, cap - 1 - len)) <= 0)
            return -1;
        len += r;
    }
    return strncmp(buf, "HTTP/1.1 200", 12) == 0 ? 0 : -1;
}

static void *run(void *arg)
{
    worker *w = arg;
    char req[1024], buf[16384];
    int rl = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n", target,
                      host, header ? header : "", header ? "\r\n" : "");
    conn c = {.fd = -1};

    if (c_open(&c) < 0) {
        w->errors = w->n;
        c_close(&c);
        return NULL;
    }
    for (int i = 0; i < w->n; i++) {
        long t0 = now_us();
        if (c_write(&c, req, rl) != rl || response(&c, buf, sizeof(buf)) < 0) {
            w->errors++;
            c_close(&c);
            if (c_open(&c) < 0)
                break;
            continue;
        }
        w->lat_us[w->done++] = now_us() - t0;
    }
    c_close(&c);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int conns, n, total = 0, errors = 0;
    worker *w;
    long t0, t1, *all;

    if (argc < 6) {
        fprintf(stderr, "usage: sp_load IP PORT HOSTNAME CONNS N [tls] [HEADER]\n");
        return 2;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    host = argv[3];
    if (!strncmp(host, "http://", 7)) {
        static char abs_target[600];
        snprintf(abs_target, sizeof(abs_target), "%s/bench", host);
        target = abs_target;
        host += 7;
    }
    conns = atoi(argv[4]);
    n = atoi(argv[5]);
    use_tls = argc > 6 && !strcmp(argv[6], "tls");
    header = argc > 7 ? argv[7] : NULL;
    if (use_tls) {
        ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    w = calloc((size_t)conns, sizeof(*w));
    all = calloc((size_t)n + 1, sizeof(long));
    t0 = now_us();
    for (int i = 0; i < conns; i++) {
        w[i].n = n / conns + (i < n % conns);
        w[i].lat_us = calloc((size_t)w[i].n + 1, sizeof(long));
        pthread_create(&w[i].t, NULL, run, &w[i]);
    }
    for (int i = 0; i < conns; i++) {
        pthread_join(w[i].t, NULL);
        memcpy(all + total, w[i].lat_us, (size_t)w[i].done * sizeof(long));
        total += w[i].done;
        errors += w[i].errors;
        free(w[i].lat_us);
    }
    t1 = now_us();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu_us = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
                    ru.ru_stime.tv_usec;
    qsort(all, (size_t)total, sizeof(long), cmp);
    printf("rps=%.0f p50_us=%ld p90_us=%ld p99_us=%ld cpu_us=%.2f errors=%d\n",
           total / ((t1 - t0) / 1e6), total ? all[total / 2] : 0,
           total ? all[total * 9 / 10] : 0, total ? all[total * 99 / 100] : 0,
           total ? cpu_us / total : 0.0, errors);
    free(all);
    free(w);
    SSL_CTX_free(ctx);
    return errors ? 1 : 0;
}
