/* The sandbox's resolver: a UDP socket on port 53 inside its netns (nftables sends every
 * DNS packet there, whatever resolver the sandbox names). A name the rules do not let the
 * proxy look up (sp_name_lookup_allowed) is answered REFUSED at once and logged blocked:
 * it never reaches the upstream resolver, whose answers would be a way out. Others are
 * answered with the addresses the proxy resolved itself, keeping only those the rules
 * allow; a name with none gets NXDOMAIN. A queries get addresses; every other type gets an empty answer
 * (no IPv6 egress), or NXDOMAIN for a denied name. Answers leave from the address the
 * query reached (IP_PKTINFO): for a query nftables redirected, the one its connection
 * tracking expects, so the sandbox sees the answer come from the resolver it asked. */
#include "proxy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define DNS_MSG_MAX 512
#define DNS_PENDING_MAX 64 /* queries in flight per sandbox */
#define TYPE_A 1
#define RCODE_REFUSED 5

typedef struct dns_q {
    sp_sandbox *sb;
    struct sockaddr_in from;
    struct in_addr local;       /* where the query arrived (after a redirect) */
    int has_local;
    uint8_t q[DNS_MSG_MAX];
    size_t qlen;
    uint16_t qtype;
    char name[SP_NAME_MAX];
} dns_q;

int sp_dns_parse_query(const uint8_t *q, size_t n, char name[SP_NAME_MAX], uint16_t *qtype,
                       size_t *qlen)
{
    size_t off = 12, out = 0;

    if (n < 12 || n > DNS_MSG_MAX)
        return -EINVAL;
    if ((q[2] & 0x80) || ((q[2] >> 3) & 0x0f) != 0 || q[4] != 0 || q[5] != 1)
        return -EINVAL; /* a response, not QUERY, or not exactly one question */
    for (;;) {
        uint8_t l;
        if (off >= n)
            return -EINVAL;
        l = q[off++];
        if (l == 0)
            break;
        if (l > 63 || off + l > n || out + l + 1 >= SP_NAME_MAX)
            return -EINVAL; /* compression pointers have no place in a question */
        if (out)
            name[out++] = '.';
        for (uint8_t i = 0; i < l; i++) {
            unsigned char c = q[off + i];
            if (!isalnum(c) && c != '-' && c != '_')
                return -EINVAL;
            name[out++] = (char)tolower(c);
        }
        off += l;
    }
    if (out == 0 || off + 4 > n)
        return -EINVAL;
    name[out] = '\0';
    *qtype = (uint16_t)(q[off] << 8 | q[off + 1]);
    *qlen = off + 4;
    return 0;
}

size_t sp_dns_answer(const uint8_t *q, size_t qlen, uint16_t qtype, int rcode,
                     const uint32_t *ips, int n, int ttl, uint8_t *out, size_t cap)
{
    size_t len = qlen;
    int an = 0;

    if (qlen > cap)
        return 0;
    memcpy(out, q, qlen);
    out[2] = (uint8_t)(0x80 | (q[2] & 0x01)); /* QR, RD copied; opcode 0, not AA */
    out[3] = (uint8_t)(0x80 | (rcode & 0x0f)); /* RA */
    if (rcode == 0 && qtype == TYPE_A) {
        for (int i = 0; i < n && len + 16 <= cap; i++, an++) {
            uint32_t ip = htonl(ips[i]);
            uint8_t rr[16] = {0xc0, 0x0c, 0, TYPE_A, 0, 1, (uint8_t)(ttl >> 24),
                              (uint8_t)(ttl >> 16), (uint8_t)(ttl >> 8), (uint8_t)ttl, 0, 4};
            memcpy(rr + 12, &ip, 4);
            memcpy(out + len, rr, 16);
            len += 16;
        }
    }
    out[6] = 0;
    out[7] = (uint8_t)an;
    memset(out + 8, 0, 4); /* no authority, no additional records (EDNS dropped) */
    return len;
}

static void reply(dns_q *d, int rcode, const uint32_t *ips, int n, int ttl)
{
    uint8_t out[DNS_MSG_MAX];
    size_t len = sp_dns_answer(d->q, d->qlen, d->qtype, rcode, ips, n, ttl, out, sizeof(out));

    union {
        char b[CMSG_SPACE(sizeof(struct in_pktinfo))];
        struct cmsghdr align;
    } cm;
    struct iovec iov = {out, len};
    struct msghdr mh = {.msg_name = &d->from, .msg_namelen = sizeof(d->from), .msg_iov = &iov,
                        .msg_iovlen = 1};

    if (!len || d->sb->dead)
        return;
    if (d->has_local) {
        struct cmsghdr *h;
        struct in_pktinfo pi = {.ipi_spec_dst = d->local};
        memset(&cm, 0, sizeof(cm));
        mh.msg_control = cm.b;
        mh.msg_controllen = sizeof(cm.b);
        h = CMSG_FIRSTHDR(&mh);
        h->cmsg_level = IPPROTO_IP;
        h->cmsg_type = IP_PKTINFO;
        h->cmsg_len = CMSG_LEN(sizeof(pi));
        memcpy(CMSG_DATA(h), &pi, sizeof(pi));
    }
    sendmsg(d->sb->dns_fd, &mh, MSG_DONTWAIT);
}

static void on_resolved(void *arg, const sp_addrs *a)
{
    dns_q *d = arg;
    sp_sandbox *sb = d->sb;
    uint32_t ok[SP_IPS_MAX];
    const char *reason = "no such name";
    int n = 0;

    for (int i = 0; i < a->n; i++)
        if (sp_decide(&sb->ctx->policy, sb->rules, d->name, a->ip[i], &reason))
            ok[n++] = a->ip[i];
    if (a->err == -EAGAIN) {
        reply(d, 2, NULL, 0, 0); /* SERVFAIL: the sandbox may retry */
    } else if (n == 0) {
        sf_netlog_entry e = {.ts_ms = sf_now_ms(), .host = d->name, .port = 53,
                             .verdict = a->err ? "failed" : "blocked", .proto = "dns",
                             .reason = a->err ? "no such name" : reason};
        sp_netlog(sb->ctx, sb->id, &e);
        reply(d, 3, NULL, 0, 0);
    } else {
        reply(d, 0, ok, n, a->ttl);
    }
    sb->dns_pending--;
    sp_sandbox_unref(sb);
    free(d);
}

void sp_dns_on_read(evutil_socket_t fd, short what, void *arg)
{
    sp_sandbox *sb = arg;

    for (int budget = 0; budget < 64; budget++) {
        dns_q *d;
        uint8_t buf[DNS_MSG_MAX + 1];
        struct sockaddr_in from;
        union {
            char b[CMSG_SPACE(sizeof(struct in_pktinfo))];
            struct cmsghdr align;
        } cm;
        struct iovec iov = {buf, sizeof(buf)};
        struct msghdr mh = {.msg_name = &from, .msg_namelen = sizeof(from), .msg_iov = &iov,
                            .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof(cm.b)};
        struct in_pktinfo pi = {0};
        int has_local = 0;
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);

        if (n < 0)
            return;
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h))
            if (h->cmsg_level == IPPROTO_IP && h->cmsg_type == IP_PKTINFO &&
                h->cmsg_len >= CMSG_LEN(sizeof(pi))) {
                memcpy(&pi, CMSG_DATA(h), sizeof(pi));
                has_local = 1;
            }
        if (sb->dead || sb->dns_pending >= DNS_PENDING_MAX || !(d = calloc(1, sizeof(*d))))
            continue; /* dropped: the sandbox's resolver retries */
        if (sp_dns_parse_query(buf, (size_t)n, d->name, &d->qtype, &d->qlen) < 0) {
            free(d);
            continue;
        }
        memcpy(d->q, buf, d->qlen);
        d->q[5] = 1; /* exactly the one question we parsed, nothing after it */
        memset(d->q + 6, 0, 6);
        d->from = from;
        d->local = pi.ipi_addr;
        d->has_local = has_local;
        if (!sp_name_lookup_allowed(&sb->ctx->policy, sb->rules, d->name)) {
            sf_netlog_entry e = {.ts_ms = sf_now_ms(), .host = d->name, .port = 53,
                                 .verdict = "blocked", .proto = "dns",
                                 .reason = SP_REASON_NAME};
            d->sb = sb;
            sp_netlog(sb->ctx, sb->id, &e);
            reply(d, RCODE_REFUSED, NULL, 0, 0);
            free(d);
            continue;
        }
        d->sb = sp_sandbox_ref(sb);
        sb->dns_pending++;
        if (!sp_resolve(sb->ctx->resolver, sb->rcache, d->name, on_resolved, d)) {
            sb->dns_pending--;
            sp_sandbox_unref(sb);
            free(d);
        }
    }
}
