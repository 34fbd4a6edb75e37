#include "sf_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TRACE_BUF (64 * 1024)
#define TRACE_LINE 192

int sf_trace_enabled;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int fd = -1;
static char buf[TRACE_BUF];
static size_t used;
static pid_t owner; /* a forked child that exits must not write the parent's stamps */

static void flush_locked(void)
{
    size_t off = 0;

    while (off < used) {
        ssize_t w = write(fd, buf + off, used - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break; /* a full disk loses stamps, never the job */
        off += (size_t)w;
    }
    used = 0;
}

static void at_exit(void)
{
    if (getpid() == owner)
        sf_trace_close();
}

int sf_trace_open(const char *dir, const char *who)
{
    static int registered;
    char path[512];
    int n;

    if (!dir || !dir[0])
        return 0;
    n = snprintf(path, sizeof(path), "%s/%s.%d.trace", dir, who, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof(path))
        return -ENAMETOOLONG;
    pthread_mutex_lock(&mu);
    if (fd < 0) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        owner = getpid();
    }
    n = fd < 0 ? -errno : 0;
    sf_trace_enabled = fd >= 0;
    pthread_mutex_unlock(&mu);
    if (n == 0 && !registered) {
        registered = 1;
        atexit(at_exit);
    }
    return n;
}

void sf_trace_close(void)
{
    pthread_mutex_lock(&mu);
    if (fd >= 0) {
        flush_locked();
        close(fd);
        fd = -1;
    }
    sf_trace_enabled = 0;
    pthread_mutex_unlock(&mu);
}

void sf_trace_stamp(const char *job, const char *stage, int64_t value)
{
    struct timespec ts;
    int n;

    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&mu);
    if (fd >= 0) {
        if (used + TRACE_LINE > sizeof(buf))
            flush_locked();
        n = snprintf(buf + used, TRACE_LINE, "%lld %.64s %.16s %lld\n",
                     (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000, job ? job : "-",
                     stage, (long long)value);
        if (n > 0)
            used += (size_t)(n < TRACE_LINE ? n : TRACE_LINE - 1);
    }
    pthread_mutex_unlock(&mu);
}
