/* The agent's processes side: background commands and their logs, stdin feeders, and
 * the process requests (plist, pkill, plogs).
 *
 * A background command (exec with bg) runs like any command but without a timeout, its
 * stdout and stderr on one pipe that the agent reads into the process's log: at most
 * LOG_MAX bytes each (the oldest dropped first; offsets count every byte ever written)
 * and LOG_TOTAL_MAX in all (then the largest log loses its oldest bytes). At most BG_MAX
 * of them run at once; an exited one keeps its log (and exit status) until its slot is
 * needed, oldest first.
 *
 * A feeder holds the stdin of one command (exec with in) that the worker sends in
 * `input` frames, and writes it to the command's pipe as the pipe takes it (at most 8 MiB
 * per command and 32 MiB for all: past that the command reads EOF early).
 *
 * plist reads /proc (the sandbox's own: the agent is its pid 1). pkill signals a process
 * (and its process group when it leads one), and answers once it is gone, sending
 * SIGKILL after grace_ms. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_int.h"
#include "sf_util.h"

#define BG_SLOTS (2 * AGENT_BG_MAX)     /* running + exited ones kept for their logs */
#define LOG_MAX (1u << 20)              /* log bytes kept per process */
#define LOG_TOTAL_MAX (8u << 20)        /* ...and for all of them */
#define LOG_READ_MAX (256u * 1024)      /* bytes in one plogs answer */
#define FEEDERS_MAX 64
#define FEED_MAX ((8u << 20) + SF_AP_DATA_MAX) /* stdin held for one command */
#define FEED_TOTAL_MAX (32u << 20)      /* ...and for all of them (a command that never
                                           reads must not grow the agent without bound) */
#define KILLS_MAX 64
#define KILL_WAIT_MS 2000               /* after the last signal, answer by then anyway */
#define KILL_POLL_MS 20
#define PROCS_BYTES (900u * 1024)       /* a procs answer stays under the frame limit */
#define PF_KTHREAD 0x00200000u

typedef struct bgproc {
    int used;
    pid_t pid;
    int fd[2];              /* the output's read ends (one merged pipe, or a detached
                               command's stdout and stderr); -1 at EOF */
    int reaped, status;
    int64_t deadline_ms;    /* a detached command: killed then (0: never) */
    int timed_out;          /* ...and it was */
    int64_t exited_ms;
    char *buf;              /* the kept bytes: offsets base .. base + len */
    size_t len, cap;        /* cap: buf's size (grows to LOG_MAX, shrinks when trimmed) */
    uint64_t base;
} bgproc;

typedef struct feeder {
    int used;
    uint32_t id;
    int fd;                 /* the command's stdin, write end */
    char *buf;
    size_t len, off;
    int eof;                /* the last input frame came */
} feeder;

typedef struct pkill {
    int used;
    uint32_t id;
    pid_t pid;
    int64_t kill_at;        /* SIGKILL then (0: no escalation) */
    int64_t give_up_at;     /* answer by then even if it still shows */
    int escalated;
    int mute;               /* asked on a connection that is gone: no answer */
} pkill;

static bgproc bgs[BG_SLOTS];
static feeder feeders[FEEDERS_MAX];
static pkill kills[KILLS_MAX];
static size_t log_total;

/* ---- background processes ------------------------------------------------ */

int agent_bg_room(void)
{
    int running = 0;
    for (int i = 0; i < BG_SLOTS; i++)
        running += bgs[i].used && !bgs[i].reaped;
    return running < AGENT_BG_MAX;
}

static bgproc *bg_find(pid_t pid)
{
    for (int i = 0; i < BG_SLOTS; i++)
        if (bgs[i].used && bgs[i].pid == pid)
            return &bgs[i];
    return NULL;
}

static void bg_free(bgproc *b)
{
    for (int s = 0; s < 2; s++)
        if (b->fd[s] >= 0)
            close(b->fd[s]);
    log_total -= b->len;
    free(b->buf);
    memset(b, 0, sizeof(*b));
    b->fd[0] = b->fd[1] = -1;
}

int agent_bg_add(pid_t pid, int fd, int fd2, int64_t deadline_ms)
{
    bgproc *b = NULL, *oldest = NULL;

    for (int i = 0; i < BG_SLOTS && !b; i++)
        if (!bgs[i].used)
            b = &bgs[i];
        else if (bgs[i].reaped && (!oldest || bgs[i].exited_ms < oldest->exited_ms))
            oldest = &bgs[i];
    if (!b && !oldest)
        return -1;
    if (!b) {
        bg_free(oldest);
        b = oldest;
    }
    memset(b, 0, sizeof(*b));
    b->used = 1;
    b->pid = pid;
    b->fd[0] = fd;
    b->fd[1] = fd2;
    b->deadline_ms = deadline_ms;
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (fd2 >= 0)
        fcntl(fd2, F_SETFL, O_NONBLOCK);
    return 0;
}

static void log_drop(bgproc *b, size_t n)
{
    if (n > b->len)
        n = b->len;
    memmove(b->buf, b->buf + n, b->len - n);
    b->len -= n;
    b->base += n;
    log_total -= n;
}

static void log_append(bgproc *b, const char *p, size_t n)
{
    if (n >= LOG_MAX) { /* only the last LOG_MAX bytes can stay */
        log_drop(b, b->len);
        b->base += n - LOG_MAX;
        p += n - LOG_MAX;
        n = LOG_MAX;
    }
    if (b->len + n > LOG_MAX)
        log_drop(b, b->len + n - LOG_MAX);
    if (b->len + n > b->cap) {
        size_t cap = b->cap * 2 > b->len + n ? b->cap * 2 : b->len + n;
        char *nb;
        if (cap < 65536)
            cap = 65536;
        if (cap > LOG_MAX)
            cap = LOG_MAX;
        if (!(nb = realloc(b->buf, cap))) {
            b->base += n; /* out of memory: counted, not kept */
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, n);
    b->len += n;
    log_total += n;
    while (log_total > LOG_TOTAL_MAX) { /* the largest log gives way */
        bgproc *big = NULL;
        for (int i = 0; i < BG_SLOTS; i++)
            if (bgs[i].used && (!big || bgs[i].len > big->len))
                big = &bgs[i];
        log_drop(big, log_total - LOG_TOTAL_MAX < 65536 ? 65536 : log_total - LOG_TOTAL_MAX);
        if (big->cap > 2 * big->len + 65536) { /* give the memory back, not only the bytes */
            char *nb = realloc(big->buf, big->len + 65536);
            if (nb) {
                big->buf = nb;
                big->cap = big->len + 65536;
            }
        }
    }
}

static void bg_drain(bgproc *b, int s)
{
    char buf[65536];

    while (b->fd[s] >= 0) {
        ssize_t n = read(b->fd[s], buf, sizeof(buf));
        if (n > 0) {
            log_append(b, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        close(b->fd[s]);
        b->fd[s] = -1;
        return;
    }
}

int agent_bg_reaped(pid_t pid, int status)
{
    bgproc *b = bg_find(pid);

    if (!b || b->reaped)
        return 0;
    b->reaped = 1;
    b->status = status;
    b->exited_ms = sf_mono_ms();
    return 1;
}

/* ---- stdin feeders ------------------------------------------------------- */

int agent_in_add(uint32_t id, int fd)
{
    for (int i = 0; i < FEEDERS_MAX; i++)
        if (!feeders[i].used) {
            feeders[i] = (feeder){.used = 1, .id = id, .fd = fd};
            fcntl(fd, F_SETFL, O_NONBLOCK);
            return 0;
        }
    return -1;
}

static void feeder_free(feeder *f)
{
    if (f->fd >= 0)
        close(f->fd);
    free(f->buf);
    memset(f, 0, sizeof(*f));
}

static void feeder_write(feeder *f)
{
    while (f->off < f->len) {
        ssize_t n = write(f->fd, f->buf + f->off, f->len - f->off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) { /* EPIPE: the command stopped reading; the rest is dropped */
            f->off = f->len = 0;
            f->eof = 1;
            break;
        }
        f->off += (size_t)n;
    }
    f->off = f->len = 0;
    if (f->eof)
        feeder_free(f);
}

/* An `input` frame: bytes for the stdin of exec id (ignored once that is gone). */
static void agent_in_data(const sf_ap_msg *m)
{
    feeder *f = NULL;
    char *nb;

    for (int i = 0; i < FEEDERS_MAX && !f; i++)
        if (feeders[i].used && feeders[i].id == m->id && !feeders[i].eof)
            f = &feeders[i];
    if (!f)
        return;
    if (m->data_len) {
        size_t held = 0;
        for (int i = 0; i < FEEDERS_MAX; i++)
            held += feeders[i].used ? feeders[i].len - feeders[i].off : 0;
        if (f->len + m->data_len > FEED_MAX || held + m->data_len > FEED_TOTAL_MAX ||
            !(nb = realloc(f->buf, f->len + m->data_len))) {
            feeder_free(f); /* over the bound: the command sees EOF early */
            return;
        }
        f->buf = nb;
        memcpy(f->buf + f->len, m->data, m->data_len);
        f->len += m->data_len;
    }
    if (!m->more)
        f->eof = 1;
    feeder_write(f);
}

/* ---- process list -------------------------------------------------------- */

static ssize_t read_small(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t got = 0, r;

    if (fd < 0)
        return -1;
    while ((size_t)got < n - 1 && (r = read(fd, buf + got, n - 1 - (size_t)got)) > 0)
        got += r;
    close(fd);
    buf[got] = '\0';
    return got;
}

/* The fields of /proc/PID/stat after "(comm)": t[0] is field 3 (state). */
#define STAT_FIELDS 22
static int read_stat(pid_t pid, char *state, uint64_t t[STAT_FIELDS], char *comm, size_t commn)
{
    char path[64], buf[1024], *open_p, *close_p, *p;
    int k;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, sizeof(buf)) <= 0 || !(open_p = strchr(buf, '(')) ||
        !(close_p = strrchr(buf, ')')) || close_p < open_p || close_p[1] != ' ')
        return -1;
    snprintf(comm, commn, "%.*s", (int)(close_p - open_p - 1), open_p + 1);
    p = close_p + 2;
    *state = *p;
    t[0] = 0;
    for (k = 1, p++; k < STAT_FIELDS && *p == ' '; k++) {
        char *end;
        t[k] = strtoull(p + 1, &end, 10);
        p = end;
    }
    return k == STAT_FIELDS ? 0 : -1;
}

static uint64_t boot_time_s(void)
{
    static char buf[16384];
    const char *p;

    if (read_small("/proc/stat", buf, sizeof(buf)) <= 0)
        return 0;
    for (p = buf; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, "btime ", 6))
            return strtoull(p + 6, NULL, 10);
    return 0;
}

static int proc_gone(pid_t pid)
{
    char state, comm[64];
    uint64_t t[STAT_FIELDS];

    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 1;
    return read_stat(pid, &state, t, comm, sizeof(comm)) < 0 || state == 'Z' || state == 'X';
}

static void do_plist(const sf_ap_msg *m)
{
    long ticks = sysconf(_SC_CLK_TCK), page_kib = sysconf(_SC_PAGESIZE) / 1024;
    uint64_t btime = boot_time_s();
    sf_ap_proc *procs = calloc(SF_AP_PROCS_MAX, sizeof(*procs));
    char *cmds = malloc((size_t)SF_AP_PROCS_MAX * (SF_AP_CMDLINE_MAX + 1));
    sf_ap_msg r = {.op = SF_AP_PROCS, .id = m->id};
    size_t n = 0, bytes = 0;
    struct dirent *e;
    DIR *d;

    if (ticks <= 0)
        ticks = 100;
    if (!procs || !cmds || !(d = opendir("/proc"))) {
        agent_send_error(m->id, errno ? errno : ENOMEM,
                         "The sandbox's agent cannot read /proc (out of memory?); retry.");
        free(procs);
        free(cmds);
        return;
    }
    while ((e = readdir(d))) {
        char path[64], comm[64], state, *cmd = cmds + n * (SF_AP_CMDLINE_MAX + 1);
        uint64_t t[STAT_FIELDS];
        ssize_t len;
        pid_t pid;

        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || read_stat(pid, &state, t, comm, sizeof(comm)) < 0 ||
            (t[6] & PF_KTHREAD) || state < '!' || state > '~')
            continue;
        if (n == SF_AP_PROCS_MAX || bytes > PROCS_BYTES) {
            r.more = 1;
            break;
        }
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
        len = read_small(path, cmd, SF_AP_CMDLINE_MAX + 1);
        for (ssize_t i = 0; i < len; i++)
            if (cmd[i] == '\0' || (unsigned char)cmd[i] < ' ')
                cmd[i] = ' ';
        while (len > 0 && cmd[len - 1] == ' ')
            cmd[--len] = '\0';
        if (len <= 0)
            snprintf(cmd, SF_AP_CMDLINE_MAX + 1, "[%s]", comm[0] ? comm : "?");
        procs[n] = (sf_ap_proc){
            .pid = (uint32_t)pid, .cmd = cmd, .state = state,
            .start_ms = btime * 1000 + t[19] * 1000 / (uint64_t)ticks,
            .cpu_ms = (t[11] + t[12]) * 1000 / (uint64_t)ticks,
            .rss_kib = t[21] * (uint64_t)(page_kib > 0 ? page_kib : 4)};
        bytes += strlen(cmd) + 48;
        n++;
    }
    closedir(d);
    r.procs = procs;
    r.n_procs = n;
    agent_send(&r);
    free(procs);
    free(cmds);
}

/* ---- kill ---------------------------------------------------------------- */

static void signal_proc(pid_t pid, int sig)
{
    kill(pid, sig);
    if (getpgid(pid) == pid) /* it leads a group (a background command, setsid): all of it */
        kill(-pid, sig);
}

static void do_pkill(const sf_ap_msg *m)
{
    char msg[256];
    pkill *k = NULL;
    pid_t pid = (pid_t)m->pid;
    int64_t now = sf_mono_ms();

    if (m->pid > INT32_MAX || pid == 1 || pid == getpid()) {
        agent_send_error(m->id, EPERM, "That process is the sandbox's agent; end the sandbox "
                                       "with sandbox_kill instead.");
        return;
    }
    if (proc_gone(pid)) {
        snprintf(msg, sizeof(msg), "No process %u runs in the sandbox; "
                 "sandbox_process_list shows those that do.", m->pid);
        agent_send_error(m->id, ESRCH, msg);
        return;
    }
    for (int i = 0; i < KILLS_MAX && !k; i++)
        if (!kills[i].used)
            k = &kills[i];
    if (!k) {
        agent_send_error(m->id, EBUSY, "64 kills are already waiting for their processes to "
                                       "end; wait for them, then retry.");
        return;
    }
    signal_proc(pid, (int)m->sig);
    *k = (pkill){.used = 1, .id = m->id, .pid = pid};
    if (m->sig != SIGKILL && m->grace_ms) {
        k->kill_at = now + m->grace_ms;
        k->give_up_at = k->kill_at + KILL_WAIT_MS;
    } else {
        k->give_up_at = now + KILL_WAIT_MS;
    }
}

static void kills_tick(int64_t now)
{
    for (int i = 0; i < KILLS_MAX; i++) {
        pkill *k = &kills[i];
        if (!k->used)
            continue;
        if (!proc_gone(k->pid) && k->kill_at && now >= k->kill_at) {
            signal_proc(k->pid, SIGKILL);
            k->kill_at = 0;
            k->escalated = 1;
            continue;
        }
        if (proc_gone(k->pid) || (!k->kill_at && now >= k->give_up_at)) {
            sf_ap_msg r = {.op = SF_AP_OK, .id = k->id, .size = (uint64_t)k->escalated};
            if (!k->mute)
                agent_send(&r);
            k->used = 0;
        }
    }
}

/* ---- logs ---------------------------------------------------------------- */

static void do_plogs(const sf_ap_msg *m)
{
    bgproc *b = m->pid <= INT32_MAX ? bg_find((pid_t)m->pid) : NULL;
    sf_ap_msg r = {.op = SF_AP_LOG, .id = m->id};
    uint64_t end, start;
    char msg[256];

    if (!b) {
        snprintf(msg, sizeof(msg), "The sandbox keeps no log of process %u: only commands "
                 "started with sandbox_exec background: true or answered still_running have "
                 "one (and an exited one's log is dropped once 64 newer ones need the room).",
                 m->pid);
        agent_send_error(m->id, ENOENT, msg);
        return;
    }
    bg_drain(b, 0); /* what it wrote up to now */
    bg_drain(b, 1);
    end = b->base + b->len;
    if (m->has_off)
        start = m->off < b->base ? b->base : m->off > end ? end : m->off;
    else if (m->tail)
        start = end - b->base > m->tail ? end - m->tail : b->base;
    else
        start = b->base;
    r.data = b->buf ? b->buf + (start - b->base) : "";
    r.data_len = end - start > LOG_READ_MAX ? LOG_READ_MAX : (size_t)(end - start);
    r.size = start;
    r.off = start + r.data_len;
    if (b->reaped) {
        r.exited = 1;
        r.exit_code = WIFSIGNALED(b->status) ? 128 + WTERMSIG(b->status)
                                             : WEXITSTATUS(b->status);
        r.timed_out = b->timed_out;
    }
    agent_send(&r);
}

/* ---- the loop's side ----------------------------------------------------- */

void agent_proc_request(const sf_ap_msg *m)
{
    switch (m->op) {
    case SF_AP_INPUT:
        agent_in_data(m);
        break;
    case SF_AP_PLIST:
        do_plist(m);
        break;
    case SF_AP_PKILL:
        do_pkill(m);
        break;
    case SF_AP_PLOGS:
        do_plogs(m);
        break;
    default:
        break;
    }
}

int agent_proc_fds(struct pollfd *pfd, int room)
{
    int n = 0;

    for (int i = 0; i < BG_SLOTS; i++)
        for (int s = 0; s < 2 && n < room; s++)
            if (bgs[i].used && bgs[i].fd[s] >= 0)
                pfd[n++] = (struct pollfd){.fd = bgs[i].fd[s], .events = POLLIN};
    for (int i = 0; i < FEEDERS_MAX && n < room; i++)
        if (feeders[i].used && feeders[i].len > feeders[i].off)
            pfd[n++] = (struct pollfd){.fd = feeders[i].fd, .events = POLLOUT};
    return n;
}

void agent_proc_events(const struct pollfd *pfd, int n)
{
    for (int j = 0; j < n; j++) {
        if (!pfd[j].revents)
            continue;
        for (int i = 0; i < BG_SLOTS; i++)
            for (int s = 0; s < 2; s++)
                if (bgs[i].used && bgs[i].fd[s] == pfd[j].fd && (pfd[j].events & POLLIN))
                    bg_drain(&bgs[i], s);
        for (int i = 0; i < FEEDERS_MAX; i++)
            if (feeders[i].used && feeders[i].fd == pfd[j].fd && (pfd[j].events & POLLOUT))
                feeder_write(&feeders[i]);
    }
}

void agent_proc_disconnected(void)
{
    for (int i = 0; i < KILLS_MAX; i++)
        kills[i].mute = 1; /* the kill goes on; its answer had nobody to go to */
    for (int i = 0; i < FEEDERS_MAX; i++)
        if (feeders[i].used) /* the stdin of a command the gone worker fed: EOF now */
            feeder_free(&feeders[i]);
}

int64_t agent_proc_tick(int64_t now)
{
    int64_t next = -1;

    kills_tick(now);
    for (int i = 0; i < KILLS_MAX; i++)
        if (kills[i].used)
            next = now + KILL_POLL_MS;
    for (int i = 0; i < BG_SLOTS; i++) { /* a detached command's timeout: its whole group */
        bgproc *b = &bgs[i];
        if (!b->used || b->reaped || !b->deadline_ms)
            continue;
        if (now >= b->deadline_ms) {
            b->timed_out = 1;
            b->deadline_ms = 0;
            kill(-b->pid, SIGKILL);
            kill(b->pid, SIGKILL);
        } else if (next < 0 || b->deadline_ms < next) {
            next = b->deadline_ms;
        }
    }
    return next;
}
