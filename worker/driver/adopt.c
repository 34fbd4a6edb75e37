/* adopt.c: see adopt.h. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adopt.h"
#include "sf_agentproto.h"
#include "sf_buf.h"
#include "sf_msg.h"
#include "sf_util.h"

/* (adopt.h) */
int wk_root_dir_open(int parent, const char *name, int make)
{
    int fd;
    struct stat st;

    if (make && mkdirat(parent, name, 0700) < 0 && errno != EEXIST)
        return -errno;
    fd = openat(parent, name, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || st.st_uid != 0 || (st.st_mode & 077)) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* state_dir/adopt (made if missing when make), checked by wk_root_dir_open. fd or -errno. */
int wk_adopt_root(const char *state_dir, int make)
{
    int sd = open(state_dir, O_DIRECTORY | O_RDONLY | O_CLOEXEC), root;

    if (sd < 0)
        return -errno;
    root = wk_root_dir_open(sd, WK_ADOPT_DIR, make);
    close(sd);
    return root;
}

/* state_dir/adopt/<id> (made if missing when make), checked the same way. fd or -errno. */
int wk_adopt_dir(const char *state_dir, const char *id, int make)
{
    int root, fd;

    if (!sf_id_valid(id))
        return -EINVAL;
    if ((root = wk_adopt_root(state_dir, make)) < 0)
        return root;
    fd = wk_root_dir_open(root, id, make);
    close(root);
    return fd;
}

/* /proc/PID/stat: the start time (field 22) and state (field 3). 0, or -ESRCH. */
int wk_proc_stat(pid_t pid, unsigned long long *start, char *state)
{
    char path[64], buf[1024], *p;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -ESRCH;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -ESRCH;
    buf[n] = '\0';
    if (!(p = strrchr(buf, ')')) || p[1] != ' ')
        return -ESRCH;
    p += 2; /* field 3 */
    *state = *p;
    for (int f = 3; f < 22; f++) {
        if (!(p = strchr(p, ' ')))
            return -ESRCH;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

/* 1 when pid's cgroup is sandfleet/<host>/<id> (or below it). */
int wk_proc_in_cgroup(pid_t pid, const char *host, const char *id)
{
    char path[64], buf[4096], want[160];
    ssize_t n;
    int fd;
    const char *p;

    snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
    snprintf(want, sizeof(want), "/sandfleet/%s/%s", host, id);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    for (p = buf; (p = strstr(p, want)); p++) {
        char after = p[strlen(want)];
        if (after == '\n' || after == '/' || after == '\0')
            return 1;
    }
    return 0;
}

int wk_agent_ping(int fd, int timeout_ms, const char **why)
{
    sf_ap_msg ping = {.op = SF_AP_PING, .id = 1}, m;
    unsigned char in[256];
    size_t got = 0, flen = 0, off = 0;
    int64_t deadline = sf_mono_ms() + timeout_ms;
    sf_buf b;
    int rc;

    sf_buf_init(&b, 64);
    if ((rc = sf_ap_encode(&b, &ping, why)) < 0)
        goto out;
    while (off < b.len) {
        ssize_t n = send(fd, b.p + off, b.len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = -EPIPE;
            *why = SF_MSG_AGENT_EXITED;
            goto out;
        }
        off += (size_t)n;
    }
    /* A pong is a few bytes: anything that does not fit is not a pong. */
    while (flen == 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - sf_mono_ms();
        int ready = left > 0 ? poll(&p, 1, (int)left) : 0;
        ssize_t n;

        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0) {
            rc = -ETIMEDOUT;
            *why = "The sandbox's agent did not answer its first ping within 5 seconds; the host may be overloaded.";
            goto out;
        }
        n = read(fd, in + got, sizeof(in) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = -EPIPE;
            *why = SF_MSG_AGENT_EXITED;
            goto out;
        }
        got += (size_t)n;
        if (sf_ap_frame_check(in, got, &flen, why) < 0 || (flen == 0 && got == sizeof(in))) {
            rc = -EBADMSG;
            *why = SF_MSG_AGENT_GARBAGE;
            goto out;
        }
    }
    if (flen != got || sf_ap_decode(in + SF_AP_HDR_LEN, flen - SF_AP_HDR_LEN, &m, why) < 0) {
        rc = -EBADMSG;
        *why = SF_MSG_AGENT_GARBAGE;
        goto out;
    }
    if (m.op != SF_AP_PONG || m.id != ping.id || m.version != SF_AP_VERSION) {
        rc = -EPROTO;
        *why = "The sandbox's agent speaks another protocol version; rebuild sandfleet-agent with the worker.";
    }
    sf_ap_msg_fini(&m);
out:
    sf_buf_fini(&b);
    return rc;
}

