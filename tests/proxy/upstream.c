/* sp_upstream: the test "internet" for the secret-proxy suites, run inside the upstream
 * network namespace. HTTP on --http PORT and HTTPS on --https PORT (certificate and key
 * given), answering every request "ok\n" (or a 302 for /redirect?to=URL) and appending
 * one JSON line per request to --log FILE: {"to": local address, "tls": bool, "method",
 * "uri", "headers": {...}}. A UDP socket on --udp PORT logs {"udp": bytes} per datagram
 * (to prove nothing reached an outside resolver). --dns PORT is a fake resolver (the
 * proxy's upstream resolver in the attack suite): it logs {"dns": name, "type": N} for
 * every query it is asked and answers names under resolver.test with A --dns-answer IP,
 * every other name NXDOMAIN (bound to --dns-addr: the resolver checks where answers come
 * from). Never answers with request headers, so
 * a swapped secret is only ever visible in the log, never to the sandbox. Without --log
 * nothing is logged (benchmarks). --files DIR serves DIR's regular files at /files/PATH. */
#include <sys/queue.h>
#include <arpa/inet.h>
#include <ctype.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static FILE *logfp;
static SSL_CTX *sslctx;

/* One JSON line per request (only with --log: benchmarks skip the work). */
static void log_request(struct evhttp_request *req, int tls)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);
    struct sockaddr_in local;
    socklen_t ll = sizeof(local);
    char to[32] = "?";
    json_t *o = json_object(), *h = json_object();
    struct evkeyval *kv;
    char *line;

    if (getsockname(bufferevent_getfd(bev), (struct sockaddr *)&local, &ll) == 0)
        inet_ntop(AF_INET, &local.sin_addr, to, sizeof(to));
    TAILQ_FOREACH(kv, evhttp_request_get_input_headers(req), next)
        json_object_set_new(h, kv->key, json_string(kv->value));
    json_object_set_new(o, "to", json_string(to));
    json_object_set_new(o, "tls", json_boolean(tls));
    json_object_set_new(o, "method", json_string(
        evhttp_request_get_command(req) == EVHTTP_REQ_GET ? "GET"
        : evhttp_request_get_command(req) == EVHTTP_REQ_POST ? "POST" : "OTHER"));
    json_object_set_new(o, "uri", json_string(evhttp_request_get_uri(req)));
    json_object_set_new(o, "body_len", json_integer(
        (json_int_t)evbuffer_get_length(evhttp_request_get_input_buffer(req))));
    json_object_set_new(o, "headers", h);
    if ((line = json_dumps(o, JSON_COMPACT))) {
        fprintf(logfp, "%s\n", line);
        fflush(logfp);
        free(line);
    }
    json_decref(o);
}

/* --files DIR: GET /files/PATH answers DIR/PATH when it is a regular file beneath DIR
 * reached through no link (a dumb-HTTP git repository for the hosted servers' --git test),
 * else 404. */
static int files_fd = -1;

static void serve_file(struct evhttp_request *req, const char *rel, struct evbuffer *out)
{
    struct open_how how = {.flags = O_RDONLY | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    char path[1024];
    struct stat st;
    int fd;

    snprintf(path, sizeof(path), "%.*s", (int)strcspn(rel, "?#"), rel);
    fd = *path ? (int)syscall(SYS_openat2, files_fd, path, &how, sizeof(how)) : -1;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        evhttp_send_reply(req, 404, "Not Found", NULL);
        return;
    }
    evbuffer_add_file(out, fd, 0, st.st_size); /* takes fd */
    evhttp_send_reply(req, 200, "OK", out);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    const char *uri = evhttp_request_get_uri(req), *to_url;
    struct evbuffer *out = evbuffer_new();

    if (logfp)
        log_request(req, arg != NULL);
    if (!strncmp(uri, "/bulk/", 6)) { /* /bulk/N: N bytes of 'x' (at most 64 MiB) */
        long n = strtol(uri + 6, NULL, 10);
        struct evbuffer_iovec v;
        if (n < 0 || n > 64L << 20)
            n = 0;
        if (n && evbuffer_reserve_space(out, n, &v, 1) == 1) {
            memset(v.iov_base, 'x', (size_t)n);
            v.iov_len = (size_t)n;
            evbuffer_commit_space(out, &v, 1);
        }
        evhttp_send_reply(req, 200, "OK", out);
    } else if (files_fd >= 0 && !strncmp(uri, "/files/", 7)) {
        serve_file(req, uri + 7, out);
    } else if (!strncmp(uri, "/redirect?to=", 13)) {
        to_url = uri + 13;
        evhttp_add_header(evhttp_request_get_output_headers(req), "Location", to_url);
        evhttp_send_reply(req, 302, "Found", NULL);
    } else {
        evbuffer_add(out, "ok\n", 3);
        evhttp_send_reply(req, 200, "OK", out);
    }
    evbuffer_free(out);
}

static struct bufferevent *ssl_bev(struct event_base *base, void *arg)
{
    return bufferevent_openssl_socket_new(base, -1, SSL_new(sslctx), BUFFEREVENT_SSL_ACCEPTING,
                                          BEV_OPT_CLOSE_ON_FREE);
}

static void on_udp(evutil_socket_t fd, short what, void *arg)
{
    char buf[2048];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);

    if (n >= 0 && logfp) {
        fprintf(logfp, "{\"udp\": %zd, \"port\": %d}\n", n, (int)(intptr_t)arg);
        fflush(logfp);
    }
}

static uint32_t dns_answer, dns_addr; /* network byte order */

static void on_dns(evutil_socket_t fd, short what, void *arg)
{
    uint8_t q[512], out[600];
    char name[256];
    struct sockaddr_in from;
    socklen_t fl = sizeof(from);
    ssize_t n = recvfrom(fd, q, sizeof(q), 0, (struct sockaddr *)&from, &fl);
    size_t off = 12, nl = 0, len;
    uint16_t type;
    int hit;

    if (n < 17)
        return;
    while (off < (size_t)n && q[off] && q[off] < 64 && off + 1 + q[off] < (size_t)n &&
           nl + q[off] + 1 < sizeof(name)) {
        if (nl)
            name[nl++] = '.';
        for (int i = 0; i < q[off]; i++) /* evdns randomizes the case (0x20 bits) */
            name[nl + i] = (char)tolower(q[off + 1 + i]);
        nl += q[off];
        off += 1u + q[off];
    }
    if (off + 5 > (size_t)n || q[off])
        return;
    name[nl] = '\0';
    off++;
    type = (uint16_t)(q[off] << 8 | q[off + 1]);
    off += 4;
    if (logfp) {
        json_t *j = json_pack("{s:s, s:i}", "dns", name, "type", (int)type);
        char *t = json_dumps(j, JSON_COMPACT);
        fprintf(logfp, "%s\n", t);
        fflush(logfp);
        free(t);
        json_decref(j);
    }
    hit = nl > 14 && !strcmp(name + nl - 14, ".resolver.test");
    memcpy(out, q, off);
    out[2] = (uint8_t)(0x84 | (q[2] & 1)); /* QR, AA, RD copied */
    out[3] = hit ? 0x80 : 0x83;            /* RA; NOERROR or NXDOMAIN */
    memset(out + 6, 0, 6);
    len = off;
    if (hit && type == 1) {
        uint8_t rr[16] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4};
        memcpy(rr + 12, &dns_answer, 4);
        memcpy(out + len, rr, 16);
        len += 16;
        out[7] = 1;
    }
    sendto(fd, out, len, 0, (struct sockaddr *)&from, fl);
}

/* Listens on port; accepted sockets inherit TCP_NODELAY (answers are not held back). */
static int bind_nodelay(struct evhttp *h, int port)
{
    struct evhttp_bound_socket *b = evhttp_bind_socket_with_handle(h, "0.0.0.0", (uint16_t)port);
    int one = 1;

    if (!b)
        return -1;
    setsockopt(evhttp_bound_socket_get_fd(b), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}

static void on_term(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv)
{
    struct event_base *base = event_base_new();
    const char *cert = NULL, *key = NULL;
    int http = 0, https = 0, udp[4] = {0}, n_udp = 0, dns = 0;
    struct event *ev_udp[4] = {NULL}, *ev_term, *ev_dns = NULL;
    struct evhttp *h1 = NULL, *h2 = NULL;

    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--http"))
            http = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--https"))
            https = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--udp") && n_udp < 4)
            udp[n_udp++] = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dns"))
            dns = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dns-addr")) /* answers must leave from it */
            inet_pton(AF_INET, argv[i + 1], &dns_addr);
        else if (!strcmp(argv[i], "--dns-answer"))
            inet_pton(AF_INET, argv[i + 1], &dns_answer);
        else if (!strcmp(argv[i], "--cert"))
            cert = argv[i + 1];
        else if (!strcmp(argv[i], "--key"))
            key = argv[i + 1];
        else if (!strcmp(argv[i], "--files"))
            files_fd = open(argv[i + 1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        else if (!strcmp(argv[i], "--log") && !(logfp = fopen(argv[i + 1], "a")))
            return 1;
    }
    if (http) {
        h1 = evhttp_new(base);
        evhttp_set_gencb(h1, on_request, NULL);
        if (bind_nodelay(h1, http) < 0)
            return 1;
    }
    if (https) {
        sslctx = SSL_CTX_new(TLS_server_method());
        if (SSL_CTX_use_certificate_chain_file(sslctx, cert) != 1 ||
            SSL_CTX_use_PrivateKey_file(sslctx, key, SSL_FILETYPE_PEM) != 1)
            return 1;
        h2 = evhttp_new(base);
        evhttp_set_bevcb(h2, ssl_bev, NULL);
        evhttp_set_gencb(h2, on_request, (void *)1);
        if (bind_nodelay(h2, https) < 0)
            return 1;
    }
    for (int i = 0; i < n_udp; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)udp[i])};
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
            return 1;
        ev_udp[i] = event_new(base, fd, EV_READ | EV_PERSIST, on_udp, (void *)(intptr_t)udp[i]);
        event_add(ev_udp[i], NULL);
    }
    if (dns) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)dns),
                                .sin_addr.s_addr = dns_addr};
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
            return 1;
        ev_dns = event_new(base, fd, EV_READ | EV_PERSIST, on_dns, NULL);
        event_add(ev_dns, NULL);
    }
    ev_term = evsignal_new(base, SIGTERM, on_term, base);
    event_add(ev_term, NULL);
    event_base_dispatch(base);
    if (h1)
        evhttp_free(h1);
    if (h2)
        evhttp_free(h2);
    for (int i = 0; i < n_udp; i++)
        event_free(ev_udp[i]);
    if (ev_dns)
        event_free(ev_dns);
    event_free(ev_term);
    SSL_CTX_free(sslctx);
    event_base_free(base);
    return 0;
}
