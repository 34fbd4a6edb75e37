#include "client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MSG_MAX (64 * 1024)

int sp_client_call(const char *sock_path, const json_t *req, int netns_fd, int timeout_ms,
                   json_t **reply, char *why, size_t whylen)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    char *txt = NULL, *buf = NULL;
    struct iovec iov;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    struct pollfd pfd;
    json_error_t jerr;
    ssize_t n;
    int fd = -1, rc;

    if (strlen(sock_path) >= sizeof(a.sun_path)) {
        snprintf(why, whylen, "The proxy's control socket path is too long.");
        return -ENAMETOOLONG;
    }
    memcpy(a.sun_path, sock_path, strlen(sock_path) + 1);
    if (!(txt = json_dumps(req, JSON_COMPACT)) || strlen(txt) > MSG_MAX ||
        !(buf = malloc(MSG_MAX + 1))) {
        rc = -E2BIG;
        snprintf(why, whylen, "The control request is too large.");
        goto out;
    }
    if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0 ||
        connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "The secret-proxy is not reachable on %s (%s); is it running?",
                 sock_path, strerror(errno));
        goto out;
    }
    iov.iov_base = txt;
    iov.iov_len = strlen(txt);
    if (netns_fd >= 0) {
        struct cmsghdr *h;
        memset(&cm, 0, sizeof(cm));
        mh.msg_control = cm.b;
        mh.msg_controllen = sizeof(cm.b);
        h = CMSG_FIRSTHDR(&mh);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &netns_fd, sizeof(int));
    }
    if (sendmsg(fd, &mh, MSG_NOSIGNAL) < 0) {
        rc = -errno;
        snprintf(why, whylen, "Cannot send to the secret-proxy: %s.", strerror(errno));
        goto out;
    }
    pfd.fd = fd;
    pfd.events = POLLIN;
    if ((rc = poll(&pfd, 1, timeout_ms)) <= 0) {
        rc = rc == 0 ? -ETIMEDOUT : -errno;
        snprintf(why, whylen, "The secret-proxy did not answer within %d ms.", timeout_ms);
        goto out;
    }
    if ((n = recv(fd, buf, MSG_MAX, 0)) <= 0) {
        rc = n == 0 ? -ECONNRESET : -errno;
        snprintf(why, whylen, "The secret-proxy closed the control connection.");
        goto out;
    }
    if (!(*reply = json_loadb(buf, (size_t)n, 0, &jerr))) {
        rc = -EBADMSG;
        snprintf(why, whylen, "The secret-proxy's reply is not JSON.");
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    free(txt);
    return rc;
}
