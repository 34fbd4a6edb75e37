/* The agent inside a microVM (qemu driver): its channel is a virtio-serial
 * port instead of an inherited socket, and a guest restored from a template
 * snapshot takes its clock, fresh entropy and its name from the worker's ping.
 *
 * The guest's init (worker/vm/init) loads the virtio modules, mounts the
 * root filesystem, /dev, /proc and /sys, and execs the agent as pid 1. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "agent_int.h"

#define PORTS_DIR "/sys/class/virtio-ports"
#define FIND_TRIES 100 /* x 50 ms: the port shows up while its driver probes */

static int read_small(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t r;

    if (fd < 0)
        return -1;
    r = read(fd, buf, n - 1);
    close(fd);
    if (r < 0)
        return -1;
    buf[r] = '\0';
    while (r > 0 && (buf[r - 1] == '\n' || buf[r - 1] == ' '))
        buf[--r] = '\0';
    return 0;
}

int agent_vm_open(void)
{
    char path[512], name[128];

    for (int tries = 0; tries < FIND_TRIES; tries++) {
        DIR *d = opendir(PORTS_DIR);
        struct dirent *e;

        while (d && (e = readdir(d))) {
            int fd;

            if (e->d_name[0] == '.' || strlen(e->d_name) > 64)
                continue;
            snprintf(path, sizeof(path), PORTS_DIR "/%s/name", e->d_name);
            if (read_small(path, name, sizeof(name)) < 0 || strcmp(name, SF_AP_VIRTIO_PORT) != 0)
                continue;
            snprintf(path, sizeof(path), "/dev/%s", e->d_name);
            fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
            closedir(d);
            return fd < 0 ? -errno : fd;
        }
        if (d)
            closedir(d);
        usleep(50 * 1000);
    }
    return -ENOENT;
}

/* Credits the worker's bytes to the kernel's pool and makes the generator
 * reseed now: every guest restored from one snapshot starts with the same
 * generator state, which must not produce the same numbers twice. */
static void reseed(const char *seed, size_t len)
{
    struct {
        struct rand_pool_info info;
        unsigned char buf[SF_AP_SEED_MAX];
    } p;
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);

    if (fd < 0)
        return;
    memset(&p, 0, sizeof(p));
    p.info.entropy_count = (int)(len * 8);
    p.info.buf_size = (int)len;
    memcpy(p.buf, seed, len);
    if (ioctl(fd, RNDADDENTROPY, &p.info) < 0)
        dprintf(2, "sandfleet-agent: cannot add entropy: %s\n", strerror(errno));
    if (ioctl(fd, RNDRESEEDCRNG) < 0)
        dprintf(2, "sandfleet-agent: cannot reseed: %s\n", strerror(errno));
    close(fd);
}

/* The guest's /etc/hosts is a link to this file (worker/vm/build-guest; /etc is read-only):
 * localhost and the guest's own name resolve without DNS (Python's http.server, for one,
 * looks its host name up before it serves). */
#define HOSTS_FILE "/run/sandfleet-hosts"

static void write_hosts(const char *name)
{
    char buf[256];
    int n = snprintf(buf, sizeof(buf),
                     "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                     "127.0.1.1\t%.64s\n", name);
    int fd, ok;

    if (n < 0 || (size_t)n >= sizeof(buf))
        return;
    if ((fd = open(HOSTS_FILE ".new", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                   0644)) < 0) {
        dprintf(2, "sandfleet-agent: cannot write " HOSTS_FILE ": %s\n", strerror(errno));
        return;
    }
    ok = write(fd, buf, (size_t)n) == n;
    if (close(fd) < 0)
        ok = 0;
    if (!ok || rename(HOSTS_FILE ".new", HOSTS_FILE) < 0) {
        dprintf(2, "sandfleet-agent: cannot write " HOSTS_FILE ": %s\n", strerror(errno));
        unlink(HOSTS_FILE ".new");
    }
}

void agent_vm_ping(const sf_ap_msg *m)
{
    if (m->now_ns) {
        struct timespec ts = {(time_t)(m->now_ns / 1000000000u), (long)(m->now_ns % 1000000000u)};
        if (clock_settime(CLOCK_REALTIME, &ts) < 0)
            dprintf(2, "sandfleet-agent: cannot set the clock: %s\n", strerror(errno));
    }
    if (m->seed_len)
        reseed(m->seed, m->seed_len);
    if (m->name && sethostname(m->name, strlen(m->name)) < 0)
        dprintf(2, "sandfleet-agent: cannot set the hostname: %s\n", strerror(errno));
    if (m->name)
        write_hosts(m->name);
}
