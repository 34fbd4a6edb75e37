/* sandfleet-agent: the guest agent, pid 1 of every sandbox.
 *
 * It talks to the worker over the socket at fd 3 (SF_AP_AGENT_FD; in the jail
 * the worker's socketpair) or, when fd 3 is not a socket, over the microVM's
 * virtio-serial port (agent_vm.c), frames as in worker/agent/proto/sf_agentproto.h, runs each
 * `exec` as /bin/sh -c CMD in its own process group (stdin /dev/null, stdout
 * and stderr through pipes kept head+tail by sf_cap), kills the group when the
 * timeout passes, and reaps every child of the sandbox (it is init). When the
 * worker's end closes, the agent exits, which ends the whole pid namespace, unless the
 * jail gave it a listening socket (fd 5, SF_AP_LISTEN_FD): then the sandbox goes on and
 * the next worker that connects there becomes its peer (a worker restart keeps its
 * sandboxes); commands asked on the old connection run on and answer nobody. In a VM the
 * port's host side unplugs and plugs in again (QEMU listens for the next worker): the same.
 *
 * Single-threaded: one poll() loop over the socket, a signalfd for SIGCHLD and
 * the pipes of running commands. Statically linked, no logging (stderr is
 * /dev/null inside the jail). Also runs outside a jail (tests): then it is a
 * child subreaper, so it still reaps everything its commands leave. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_int.h"
#include "sf_agentproto.h"
#include "sf_buf.h"
#include "sf_cap.h"
#include "sf_util.h"

#define JOBS_MAX 64             /* concurrent commands */
#define ORPHANS_MAX 64          /* pipes still held by background processes */
#define CHUNK (64 * 1024)
#define OUTQ_MAX (64u << 20)    /* results waiting for the worker to read */
#define DEFAULT_CWD "/root"
#define GROUP_GRACE_MS 2000     /* after a timeout kill, wait this long at most for
                                   the whole process group to be gone */
#define STREAM_BUF (16 * 1024)  /* streamed output held per stream between frames */
#define STREAM_SEND (8 * 1024)  /* ...sent once this much is held */
#define STREAM_FLUSH_MS 100     /* ...or once its first byte waited this long */
#define STREAM_BUDGET (1u << 20) /* output streamed per command; the rest only counts */
#define PIPE_OUTQ_HIGH (4u << 20) /* a pipe exec's output waits in its pipes past this */
#define PROC_FDS (2 * AGENT_BG_MAX + 64) /* background logs + stdin feeders (agent_proc.c) */

typedef struct job {
    int used;
    uint32_t id;
    pid_t pid;
    int fd[2];                  /* stdout, stderr read ends; -1 once closed */
    sf_cap cap[2];
    int64_t start_ms;
    int64_t deadline_ms;
    int64_t kill_ms;            /* when the timeout kill was sent */
    int64_t detach_ms;          /* then, still running: it goes on as a background
                                   command and the result says so (0: never) */
    int reaped;
    int status;
    int timed_out;
    uint64_t oom0;              /* vm: the guest's OOM kills when the command started */
    /* exec with stream: output frames as the command writes (bounded; the result still
       carries the capped output) */
    int stream;
    char *sbuf[2];
    size_t slen[2];
    uint64_t skipped[2];        /* bytes not streamed (buffer full or budget spent) */
    int64_t sfirst_ms;          /* when the oldest held byte arrived (0: none held) */
    uint64_t streamed;
    int pipe;                   /* a duplex session: output frames at once, no budget */
    int stale;                  /* started on a worker connection that is gone: it runs
                                   on (to its timeout), nothing of it is sent */
} job;

static job jobs[JOBS_MAX];
static int orphans[ORPHANS_MAX];
static int n_orphans;
static sf_buf inq, outq;
static int sock = SF_AP_AGENT_FD;
static int devnull = -1;
static int vm;              /* the channel is a virtio-serial port */
static int unplugged;       /* vm: the host side is not connected (read gave EOF) */
#define REPLUG_POLL_MS 100  /* vm: how often an unplugged port is tried again */
static int box_fd = -1;         /* the cgroup file commands join (SF_AP_BOX_FD), if given */
static int lfd = -1;            /* jail: where a restarted worker connects (SF_AP_LISTEN_FD) */

/* vm: OOM kills in the guest so far (the `oom_kill` line of /proc/vmstat; the guest is
 * the sandbox, so any is its own), 0 if unknown. A jail's host sees them in its cgroup. */
static uint64_t vm_oom_kills(void)
{
    static char buf[16384];
    size_t len = 0;
    ssize_t n;
    const char *p;
    int fd = open("/proc/vmstat", O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return 0;
    while (len < sizeof(buf) - 1 && (n = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
        len += (size_t)n;
    close(fd);
    buf[len] = '\0';
    for (p = buf; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, "oom_kill ", 9))
            return strtoull(p + 9, NULL, 10);
    return 0;
}

/* Commands longer than this reach the shell through a memfd rather than argv: Linux
 * refuses any single argument over 128 KiB (MAX_ARG_STRLEN), and argv shares the
 * exec's ~2 MiB with the environment. */
#define ARGV_CMD_MAX (64 * 1024)
#define SCRIPT_FD 9

static const char *const default_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "TERM=xterm",
};
#define N_DEFAULT_ENV (sizeof(default_env) / sizeof(default_env[0]))

static void die(const char *msg)
{
    dprintf(2, "sandfleet-agent: %s\n", msg);
    _exit(1);
}

/* ---- replies ------------------------------------------------------------- */

void agent_send(const sf_ap_msg *m)
{
    const char *why = NULL;
    int rc = sf_ap_encode(&outq, m, &why);
    if (rc == -E2BIG || rc == -ENOMEM)
        die("reply queue full: the worker stopped reading");
    if (rc < 0)
        dprintf(2, "sandfleet-agent: cannot encode %s: %s\n", sf_ap_op_name(m->op),
                why ? why : "error");
}

void agent_send_error(uint32_t id, int errnum, const char *msg)
{
    sf_ap_msg m = {.op = SF_AP_ERROR, .id = id, .msg = msg,
                   .errnum = errnum > 0 && errnum < 4096 ? (uint32_t)errnum : 0};
    agent_send(&m);
}

static void send_error(uint32_t id, const char *msg)
{
    agent_send_error(id, 0, msg);
}

/* ---- streamed output ----------------------------------------------------- */

static void stream_add(job *j, int s, const char *p, size_t n)
{
    size_t room;

    if (!j->stream)
        return;
    if (!j->sbuf[s] && !(j->sbuf[s] = malloc(STREAM_BUF))) {
        j->skipped[s] += n;
        return;
    }
    room = j->streamed + j->slen[0] + j->slen[1] >= STREAM_BUDGET ? 0 : STREAM_BUF - j->slen[s];
    if (room > n)
        room = n;
    memcpy(j->sbuf[s] + j->slen[s], p, room);
    j->slen[s] += room;
    j->skipped[s] += n - room;
    if (!j->sfirst_ms && j->slen[s])
        j->sfirst_ms = sf_mono_ms();
}

static void stream_send(job *j, int s, const char *p, size_t n)
{
    sf_ap_msg m = {.op = SF_AP_OUTPUT, .id = j->id, .s = (uint32_t)s, .data = p, .data_len = n};
    if (!j->stale)
        agent_send(&m);
}

/* Sends what is held (all of it with force, else once enough is held or it waited). */
static void stream_flush(job *j, int force, int64_t now)
{
    if (!j->stream || !j->sfirst_ms)
        return;
    if (!force && j->slen[0] < STREAM_SEND && j->slen[1] < STREAM_SEND &&
        now - j->sfirst_ms < STREAM_FLUSH_MS)
        return;
    for (int s = 0; s < 2; s++) {
        if (j->slen[s]) {
            stream_send(j, s, j->sbuf[s], j->slen[s]);
            j->streamed += j->slen[s];
            j->slen[s] = 0;
        }
        if (j->skipped[s] && (force || j->streamed < STREAM_BUDGET)) {
            char mark[96];
            int k = snprintf(mark, sizeof(mark), "\n[... %llu bytes not streamed ...]\n",
                             (unsigned long long)j->skipped[s]);
            stream_send(j, s, mark, (size_t)k);
            j->skipped[s] = 0;
        }
    }
    j->sfirst_ms = 0;
}

/* ---- jobs ---------------------------------------------------------------- */

static void orphan_add(int fd)
{
    if (n_orphans == ORPHANS_MAX) {
        close(orphans[0]);
        memmove(orphans, orphans + 1, (ORPHANS_MAX - 1) * sizeof(int));
        n_orphans--;
    }
    orphans[n_orphans++] = fd;
}

/* Reads what a pipe holds now. Returns 1 at EOF (fd closed), 0 otherwise. */
static int drain(job *j, int s)
{
    char buf[CHUNK];

    for (;;) {
        ssize_t n;

        if (j->pipe && outq.len >= PIPE_OUTQ_HIGH)
            return 0; /* the worker reads slowly: the command waits on its pipe */
        n = read(j->fd[s], buf, sizeof(buf));
        if (n > 0) {
            sf_cap_append(&j->cap[s], buf, (size_t)n);
            if (j->pipe)
                stream_send(j, s, buf, (size_t)n);
            else
                stream_add(j, s, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        close(j->fd[s]);
        j->fd[s] = -1;
        return 1;
    }
}

static void job_free(job *j)
{
    for (int s = 0; s < 2; s++) {
        if (j->fd[s] >= 0)
            close(j->fd[s]);
        sf_cap_fini(&j->cap[s]);
        free(j->sbuf[s]);
    }
    memset(j, 0, sizeof(*j));
}

static void job_finish(job *j)
{
    size_t lens[2];
    char *kept[2];
    sf_ap_msg m = {.op = SF_AP_RESULT, .id = j->id};
    int64_t ms = sf_mono_ms() - j->start_ms;

    /* What the command wrote before it exited is in the pipes; background
     * processes that still hold them are drained (and discarded) from now on. */
    for (int s = 0; s < 2; s++) {
        if (j->fd[s] >= 0 && !drain(j, s)) {
            orphan_add(j->fd[s]);
            j->fd[s] = -1;
        }
        if (s == 1)
            stream_flush(j, 1, 0); /* the streamed output comes before the result */
        lens[s] = sf_cap_len(&j->cap[s]);
        kept[s] = malloc(lens[s] + 1);
        if (!kept[s])
            die("out of memory");
        sf_cap_copy(&j->cap[s], kept[s]);
    }
    if (j->timed_out)
        m.exit_code = -1;
    else if (WIFSIGNALED(j->status))
        m.exit_code = 128 + WTERMSIG(j->status);
    else
        m.exit_code = WEXITSTATUS(j->status);
    m.timed_out = j->timed_out;
    m.truncated = sf_cap_truncated(&j->cap[0]) || sf_cap_truncated(&j->cap[1]);
    m.oom_killed = vm && vm_oom_kills() > j->oom0;
    m.duration_ms = ms < 0 ? 0 : ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    m.out = kept[0];
    m.out_len = lens[0];
    m.out_total = j->cap[0].total;
    m.err = kept[1];
    m.err_len = lens[1];
    m.err_total = j->cap[1].total;
    if (!j->stale)
        agent_send(&m);
    free(kept[0]);
    free(kept[1]);
    job_free(j);
}

static const char *env_key_end(const char *kv)
{
    return strchr(kv, '=');
}

/* default_env entries not overridden by the request, then the request's. */
static char **build_env(const sf_ap_msg *m)
{
    size_t n = 0;
    char **env = calloc(N_DEFAULT_ENV + m->env_n + 1, sizeof(char *));

    if (!env)
        return NULL;
    for (size_t d = 0; d < N_DEFAULT_ENV; d++) {
        size_t klen = (size_t)(env_key_end(default_env[d]) - default_env[d]);
        int overridden = 0;
        for (size_t i = 0; i < m->env_n; i++)
            if (strncmp(m->env[i], default_env[d], klen + 1) == 0)
                overridden = 1;
        if (!overridden)
            env[n++] = (char *)default_env[d];
    }
    for (size_t i = 0; i < m->env_n; i++)
        env[n++] = (char *)m->env[i];
    env[n] = NULL;
    return env;
}

/* What the command's child needs; it runs on the agent's memory (CLONE_VM|CLONE_VFORK,
 * the agent waits until it execs or exits), so it writes its failure here: stage (0 fds,
 * 1 cwd, 2 exec, 3 cgroup; -1 none) and errno. */
typedef struct spawn_arg {
    const sf_ap_msg *m;
    const char *cwd;
    char **env;
    int in_r, out_w, err_w, script_fd; /* in_r -1: /dev/null */
    volatile int stage, err;
} spawn_arg;

/* The child, on its own small stack and the agent's memory until execve: only
 * async-signal-safe calls, nothing that touches the agent's heap or its state. It has its
 * own signal dispositions, fd table and cwd (no CLONE_SIGHAND, CLONE_FILES, CLONE_FS).
 * script_fd >= 0: the command is in that memfd and the shell sources it from SCRIPT_FD
 * (which it closes first thing). */
static int child_exec(void *arg)
{
    spawn_arg *a = arg;
    sigset_t none;
    char *argv[] = {"sh", "-c", (char *)a->m->cmd, NULL};
    char *argv_script[] = {"sh", "-c", ". /proc/self/fd/9", NULL};
    int stage;

    /* SIGPIPE back to its default before any signal is let in (the agent ignores it) */
    signal(SIGPIPE, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    /* Into the box first: a command never runs in the agent's own memory group. */
    if (box_fd >= 0 && write(box_fd, "0", 1) != 1) {
        stage = 3;
        goto fail;
    }
    if (dup2(a->in_r >= 0 ? a->in_r : devnull, 0) < 0 || dup2(a->out_w, 1) < 0 ||
        dup2(a->err_w, 2) < 0 ||
        (a->script_fd >= 0 && dup2(a->script_fd, SCRIPT_FD) < 0)) {
        stage = 0;
        goto fail;
    }
    if (chdir(a->cwd) < 0) {
        stage = 1;
        goto fail;
    }
    execve("/bin/sh", a->script_fd >= 0 ? argv_script : argv, a->env);
    stage = 2;
fail:
    a->err = errno;
    a->stage = stage;
    _exit(127);
}

/* The child's stack: one child at a time uses it (the agent waits while it runs). */
static char child_stack[64 * 1024] __attribute__((aligned(16)));

/* A sealed memfd holding "exec 9<&-" and the command, for commands too long for argv. */
static int script_memfd(const char *cmd)
{
    static const char head[] = "exec 9<&-\n";
    size_t len = strlen(cmd), off = 0;
    int fd = memfd_create("sandfleet-command", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0)
        return -1;
    if (write(fd, head, sizeof(head) - 1) != (ssize_t)(sizeof(head) - 1))
        goto fail;
    while (off < len) {
        ssize_t n = write(fd, cmd + off, len - off);
        if (n <= 0)
            goto fail;
        off += (size_t)n;
    }
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
    return fd;
fail:
    close(fd);
    return -1;
}

static void spawn_error(uint32_t id, int stage, int err, const char *cwd)
{
    char msg[SF_AP_MSG_MAX];

    if (stage == 1 && (err == ENOENT || err == ENOTDIR))
        snprintf(msg, sizeof(msg),
                 "The working directory %.200s does not exist in the sandbox; create it "
                 "first (mkdir -p) or pass an existing directory as cwd.", cwd);
    else if (stage == 1)
        snprintf(msg, sizeof(msg),
                 "The working directory %.200s cannot be entered (%s); pass a directory "
                 "the sandbox user can access.", cwd, strerror(err));
    else if (stage == 2 && err == E2BIG)
        snprintf(msg, sizeof(msg),
                 "The command's environment is too large for the kernel (about 2 MiB in all, "
                 "128 KiB per variable); pass large values through a file instead.");
    else if (stage == 2 && (err == ENOENT || err == ENOEXEC || err == EACCES || err == ELOOP ||
                            err == ENOTDIR))
        snprintf(msg, sizeof(msg),
                 "The sandbox cannot start /bin/sh (%s); its root filesystem is damaged, "
                 "recreate the sandbox.", strerror(err));
    else if (stage == 2)
        snprintf(msg, sizeof(msg),
                 "The sandbox could not start /bin/sh (%s); it may be out of memory: free "
                 "some, then retry.", strerror(err));
    else if (stage == 3)
        snprintf(msg, sizeof(msg),
                 "The command could not join the sandbox's memory group (%s); kill this "
                 "sandbox and create a new one.", strerror(err));
    else
        snprintf(msg, sizeof(msg), "The command could not be started (%s); retry.",
                 strerror(err));
    send_error(id, msg);
}

static void job_start(const sf_ap_msg *m)
{
    const char *cwd = m->cwd ? m->cwd : DEFAULT_CWD;
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, pi[2] = {-1, -1}, script = -1;
    spawn_arg a;
    job *j = NULL;
    char **env = NULL;
    pid_t pid;

    for (int i = 0; i < JOBS_MAX; i++)
        if (jobs[i].used && jobs[i].id == m->id) {
            send_error(m->id, "A command with this request id is already running.");
            return;
        }
    if (m->bg && !agent_bg_room()) {
        send_error(m->id, "64 background processes already run in this sandbox (the limit); "
                          "end some with sandbox_process_kill, then retry.");
        return;
    }
    for (int i = 0; i < JOBS_MAX && !j; i++)
        if (!jobs[i].used)
            j = &jobs[i];
    if (!j) {
        send_error(m->id, "Too many commands are running in this sandbox (limit 64); "
                          "wait for one to finish, then retry.");
        return;
    }
    memset(j, 0, sizeof(*j));
    j->fd[0] = j->fd[1] = -1;
    if (sf_cap_init(&j->cap[0], m->cap) < 0 || sf_cap_init(&j->cap[1], m->cap) < 0 ||
        !(env = build_env(m)) || pipe2(po, O_CLOEXEC) < 0 ||
        (!m->bg && pipe2(pe, O_CLOEXEC) < 0) || (m->in && pipe2(pi, O_CLOEXEC) < 0)) {
        send_error(m->id, "The sandbox is out of memory or file descriptors; free some "
                          "resources, then retry.");
        goto fail;
    }
    if (strlen(m->cmd) > ARGV_CMD_MAX && (script = script_memfd(m->cmd)) < 0) {
        send_error(m->id, "The sandbox is out of memory for this command's text; free "
                          "some memory, then retry.");
        goto fail;
    }
    if (vm)
        j->oom0 = vm_oom_kills();
    j->start_ms = sf_mono_ms();
    /* clone(CLONE_VM|CLONE_VFORK), as posix_spawn does: no copy of the agent's page
     * tables and no copy-on-write faults after it (fork's cost, paid per command); the
     * agent goes on once the child has exec'd or failed. */
    /* background: stdout and stderr on one pipe (its log) */
    a = (spawn_arg){.m = m, .cwd = cwd, .env = env, .in_r = pi[0], .out_w = po[1],
                    .err_w = m->bg ? po[1] : pe[1], .script_fd = script, .stage = -1, .err = 0};
    pid = clone(child_exec, child_stack + sizeof(child_stack), CLONE_VM | CLONE_VFORK | SIGCHLD,
                &a);
    if (pid < 0) {
        if (errno == EAGAIN)
            send_error(m->id, "The sandbox reached its process limit, so the command could "
                              "not start; wait for its processes to end, or kill the sandbox "
                              "and create a new one.");
        else
            send_error(m->id, "The sandbox could not start a process; retry.");
        goto fail;
    }
    if (script >= 0)
        close(script);
    script = -1;
    close(po[1]);
    if (pe[1] >= 0)
        close(pe[1]);
    if (pi[0] >= 0)
        close(pi[0]);
    po[1] = pe[1] = pi[0] = -1;
    free(env);
    env = NULL;
    if (m->in && (a.stage >= 0 || agent_in_add(m->id, pi[1]) < 0))
        close(pi[1]); /* not started, or 64 stdins pending: this command reads EOF */
    pi[1] = -1;
    if (m->bg) {
        if (a.stage >= 0) { /* it exits 127 and is reaped as an unknown child */
            spawn_error(m->id, a.stage, a.err, cwd);
            close(po[0]);
        } else if (agent_bg_add(pid, po[0], -1, 0) < 0) {
            close(po[0]); /* cannot happen: agent_bg_room() said there is a slot */
        }
        if (a.stage < 0) {
            sf_ap_msg ok = {.op = SF_AP_OK, .id = m->id, .size = (uint64_t)pid};
            agent_send(&ok);
        }
        job_free(j);
        return;
    }
    j->used = 1;
    j->id = m->id;
    j->pid = pid;
    j->stream = m->stream;
    j->pipe = m->pipe && m->in && m->stream;
    j->fd[0] = po[0];
    j->fd[1] = pe[0];
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    j->deadline_ms = j->start_ms + m->timeout_ms;
    if (m->detach_ms && m->detach_ms < m->timeout_ms)
        j->detach_ms = j->start_ms + m->detach_ms;
    if (a.stage >= 0) {
        /* The child failed before exec; it exits 127 and is reaped by the loop. */
        spawn_error(m->id, a.stage, a.err, cwd);
        j->id = 0;
        j->timed_out = -1; /* marker: no result to send */
    }
    return;
fail:
    free(env);
    if (script >= 0)
        close(script);
    for (int i = 0; i < 2; i++) {
        if (po[i] >= 0)
            close(po[i]);
        if (pe[i] >= 0)
            close(pe[i]);
        if (pi[i] >= 0)
            close(pi[i]);
    }
    job_free(j);
}

/* True while any process of the job's group exists (zombies included: they
 * leave the group when reaped, and we reap them all). */
static int group_alive(const job *j)
{
    return kill(-j->pid, 0) == 0 || errno != ESRCH;
}

static void reap(void)
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (agent_bg_reaped(pid, status))
            continue;
        for (int i = 0; i < JOBS_MAX; i++) {
            job *j = &jobs[i];
            if (!j->used || j->pid != pid)
                continue;
            j->reaped = 1;
            j->status = status;
            if (j->timed_out < 0)
                job_free(j);
            else if (!j->timed_out)
                job_finish(j);
            break;
        }
    }
}

/* A command still running at its detach time becomes a background command (its timeout
 * kept): the result carries the output so far and its pid; what it writes from now on
 * goes to its log (plogs). Stays in the foreground while 64 background commands run. */
static void job_detach(job *j, int64_t now)
{
    size_t lens[2];
    char *kept[2];
    sf_ap_msg m = {.op = SF_AP_RESULT, .id = j->id, .pid = (uint32_t)j->pid};
    int64_t ms = now - j->start_ms;

    j->detach_ms = 0;
    if (!agent_bg_room())
        return;
    for (int s = 0; s < 2; s++)
        if (j->fd[s] >= 0 && drain(j, s))
            j->fd[s] = -1;
    if (agent_bg_add(j->pid, j->fd[0] >= 0 ? j->fd[0] : j->fd[1],
                     j->fd[0] >= 0 ? j->fd[1] : -1, j->deadline_ms) < 0)
        return;
    j->fd[0] = j->fd[1] = -1; /* the log's now */
    stream_flush(j, 1, 0);
    for (int s = 0; s < 2; s++) {
        lens[s] = sf_cap_len(&j->cap[s]);
        if (!(kept[s] = malloc(lens[s] + 1)))
            die("out of memory");
        sf_cap_copy(&j->cap[s], kept[s]);
    }
    m.truncated = sf_cap_truncated(&j->cap[0]) || sf_cap_truncated(&j->cap[1]);
    m.duration_ms = ms < 0 ? 0 : ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    m.out = kept[0];
    m.out_len = lens[0];
    m.out_total = j->cap[0].total;
    m.err = kept[1];
    m.err_len = lens[1];
    m.err_total = j->cap[1].total;
    if (!j->stale)
        agent_send(&m);
    free(kept[0]);
    free(kept[1]);
    job_free(j);
}

/* Kills groups whose time is up; a killed job answers once its whole group
 * is gone (so "timed out" means nothing of it still runs), or after
 * GROUP_GRACE_MS if something refuses to die. */
static void check_timeouts(int64_t now)
{
    for (int i = 0; i < JOBS_MAX; i++) {
        job *j = &jobs[i];
        if (!j->used)
            continue;
        if (!j->reaped && !j->timed_out && j->detach_ms && now >= j->detach_ms &&
            now < j->deadline_ms) {
            job_detach(j, now);
        } else if (!j->reaped && !j->timed_out && now >= j->deadline_ms) {
            j->timed_out = 1;
            j->kill_ms = now;
            kill(-j->pid, SIGKILL);
            kill(j->pid, SIGKILL);
        } else if (j->reaped && j->timed_out == 1) {
            if (!group_alive(j) || now - j->kill_ms >= GROUP_GRACE_MS)
                job_finish(j);
            else
                kill(-j->pid, SIGKILL);
        }
    }
}

/* Kills the processes of a running command (its process group); the command then
 * answers as usual (killed by SIGKILL). ok.size: 1 when it ran, 0 when it had ended. */
static void job_cancel(const sf_ap_msg *m)
{
    sf_ap_msg r = {.op = SF_AP_OK, .id = m->id};

    for (int i = 0; i < JOBS_MAX; i++) {
        job *j = &jobs[i];
        if (!j->used || j->stale || j->id != m->target || j->timed_out < 0)
            continue;
        kill(-j->pid, SIGKILL);
        if (!j->reaped)
            kill(j->pid, SIGKILL);
        r.size = 1;
        break;
    }
    agent_send(&r);
}

/* ---- requests ------------------------------------------------------------ */

static void handle_frame(const char *payload, size_t len)
{
    const char *why = NULL;
    char msg[SF_AP_MSG_MAX];
    sf_ap_msg m;

    if (sf_ap_decode(payload, len, &m, &why) < 0) {
        snprintf(msg, sizeof(msg), "The agent rejected a malformed request: %s.", why);
        send_error(m.id, msg);
        return;
    }
    switch (m.op) {
    case SF_AP_PING: {
        sf_ap_msg pong = {.op = SF_AP_PONG, .id = m.id, .version = SF_AP_VERSION};
        if (m.now_ns || m.seed_len || m.name)
            agent_vm_ping(&m);
        agent_send(&pong);
        break;
    }
    case SF_AP_EXEC:
        job_start(&m);
        break;
    case SF_AP_CANCEL:
        job_cancel(&m);
        break;
    case SF_AP_FREAD:
    case SF_AP_FWRITE:
    case SF_AP_FLIST:
    case SF_AP_FMOVE:
    case SF_AP_FDEL:
        agent_fs_request(&m);
        break;
    case SF_AP_INPUT:
    case SF_AP_PLIST:
    case SF_AP_PKILL:
    case SF_AP_PLOGS:
        agent_proc_request(&m);
        break;
    default:
        send_error(m.id, "The agent only accepts requests (ping, exec, cancel and the file "
                         "requests).");
        break;
    }
    sf_ap_msg_fini(&m);
}

/* Returns -1 when the worker closed its end. */
static int read_sock(void)
{
    char buf[CHUNK];
    const char *why = NULL;
    size_t flen;
    ssize_t n;

    for (;;) {
        n = read(sock, buf, sizeof(buf));
        if (n == 0)
            return -1;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            return -1;
        }
        if (sf_buf_append(&inq, buf, (size_t)n) < 0)
            die("inbound frame over the limit");
        for (;;) {
            if (sf_ap_frame_check(inq.p, inq.len, &flen, &why) < 0)
                die(why);
            if (flen == 0)
                break;
            handle_frame(inq.p + SF_AP_HDR_LEN, flen - SF_AP_HDR_LEN);
            sf_buf_consume(&inq, flen);
        }
    }
}

/* Jail with a listener, or a VM's port unplugged: the worker's connection went (it died,
 * or stopped for an upgrade; a restarted worker connects again, and its request ids start
 * anew). The sandbox goes on; what was asked on that connection answers nobody. */
static void disconnected(void)
{
    if (vm) {
        unplugged = 1; /* the port stays open: the host side plugs in again */
    } else {
        if (sock >= 0)
            close(sock);
        sock = -1;
    }
    sf_buf_consume(&inq, inq.len);
    sf_buf_consume(&outq, outq.len);
    for (int i = 0; i < JOBS_MAX; i++)
        if (jobs[i].used) {
            jobs[i].stale = 1;
            if (jobs[i].pipe) { /* a duplex session lives as long as its worker does */
                kill(-jobs[i].pid, SIGKILL);
                kill(jobs[i].pid, SIGKILL);
            }
        }
    agent_proc_disconnected();
}

/* A worker connects on the listener (only host root can reach its directory): it
 * becomes the peer; an older connection still open is dropped. */
static void accept_worker(void)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd < 0)
        return;
    if (sock >= 0)
        disconnected();
    sock = fd;
}

static int flush_sock(void)
{
    while (outq.len > 0) {
        ssize_t n = write(sock, outq.p, outq.len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            if (vm && errno == ENODEV) { /* the host side went away: see main() */
                if (!unplugged)
                    disconnected();
                return 0;
            }
            return -1;
        }
        sf_buf_consume(&outq, (size_t)n);
    }
    return 0;
}

int main(int argc, char **argv)
{
#define NFDS (3 + 2 * JOBS_MAX + ORPHANS_MAX + PROC_FDS)
    struct pollfd pfd[NFDS];
    job *owner[NFDS];
    int stream[NFDS];
    struct stat st;
    sigset_t mask;
    int sfd;

    /* The qemu worker's holder of a saved VM's network namespace (qemu_spawn.c): it only
     * lives there until the VM is loaded again or killed. */
    if (argc == 2 && !strcmp(argv[1], "--hold-netns"))
        for (;;)
            pause();

    if (fstat(sock, &st) < 0 || !S_ISSOCK(st.st_mode)) {
        if ((sock = agent_vm_open()) < 0)
            die("fd 3 must be the worker's socket, or the virtio-serial port "
                SF_AP_VIRTIO_PORT " must exist (run by the sandfleet worker)");
        vm = 1;
    }
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    {
        int acc = 0;
        socklen_t al = sizeof(acc);
        if (!vm && fstat(SF_AP_LISTEN_FD, &st) == 0 && S_ISSOCK(st.st_mode) &&
            getsockopt(SF_AP_LISTEN_FD, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) == 0 && acc) {
            lfd = SF_AP_LISTEN_FD;
            fcntl(lfd, F_SETFD, FD_CLOEXEC);
            fcntl(lfd, F_SETFL, O_NONBLOCK);
            fcntl(SF_AP_SLOT_FD, F_SETFD, FD_CLOEXEC); /* (kept, never used: a lock) */
        }
    }
    if (vm) /* previews reach the guest's loopback through it (agent_relay.c) */
        agent_relay_start();
    /* fd 4, when the jail gave one: the box's cgroup file. Close-on-exec, so that no
     * command holds it (it could move other processes, the agent included). */
    if (!vm && fstat(SF_AP_BOX_FD, &st) == 0 && S_ISREG(st.st_mode)) {
        box_fd = SF_AP_BOX_FD;
        fcntl(box_fd, F_SETFD, FD_CLOEXEC);
    }
    /* Not dumpable: the sandbox's processes (no CAP_SYS_PTRACE) cannot open
     * /proc/1/mem and friends. Commands become dumpable again at exec. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* Outside a jail (tests), orphans of our commands come back to us too. */
    if (getpid() != 1)
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    fcntl(sock, F_SETFL, O_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (sfd < 0 || devnull < 0)
        die("cannot set up signalfd or /dev/null");
    sf_buf_init(&inq, SF_AP_HDR_LEN + SF_AP_FRAME_MAX + CHUNK);
    sf_buf_init(&outq, OUTQ_MAX);

    for (;;) {
        int64_t now = sf_mono_ms(), next = -1;
        int n = 0, nj, timeout;
        /* First: a kill it answers now must be in outq before pfd[0] asks for POLLOUT. */
        int64_t pn = agent_proc_tick(now);

        /* An unplugged port polls as POLLHUP at once: leave it out and retry it. */
        pfd[n] = (struct pollfd){.fd = unplugged || sock < 0 ? -1 : sock,
                                 .events = POLLIN | (outq.len ? POLLOUT : 0)};
        owner[n++] = NULL;
        if (unplugged)
            next = now + REPLUG_POLL_MS;
        pfd[n] = (struct pollfd){.fd = sfd, .events = POLLIN};
        owner[n++] = NULL;
        pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
        owner[n++] = NULL;
        for (int i = 0; i < JOBS_MAX; i++) {
            job *j = &jobs[i];
            if (!j->used)
                continue;
            for (int s = 0; s < 2; s++)
                if (j->fd[s] >= 0 && !(j->pipe && outq.len >= PIPE_OUTQ_HIGH)) {
                    stream[n] = s;
                    owner[n] = j;
                    pfd[n++] = (struct pollfd){.fd = j->fd[s], .events = POLLIN};
                }
            if (!j->reaped && !j->timed_out && (next < 0 || j->deadline_ms < next))
                next = j->deadline_ms;
            if (!j->reaped && !j->timed_out && j->detach_ms && j->detach_ms < next)
                next = j->detach_ms;
            if (j->timed_out == 1 && (next < 0 || j->kill_ms + GROUP_GRACE_MS < next))
                next = j->kill_ms + GROUP_GRACE_MS;
            if (j->sfirst_ms && (next < 0 || j->sfirst_ms + STREAM_FLUSH_MS < next))
                next = j->sfirst_ms + STREAM_FLUSH_MS;
        }
        for (int i = 0; i < n_orphans; i++) {
            owner[n] = NULL;
            stream[n] = i;
            pfd[n++] = (struct pollfd){.fd = orphans[i], .events = POLLIN};
        }
        nj = n;
        n += agent_proc_fds(pfd + n, NFDS - n);
        if (pn >= 0 && (next < 0 || pn < next))
            next = pn;
        timeout = next < 0 ? -1 : next <= now ? 0 : (int)(next - now > 60000 ? 60000 : next - now);
        if (poll(pfd, (nfds_t)n, timeout) < 0) {
            if (errno == EINTR)
                continue;
            die("poll failed");
        }
        if (pfd[2].revents & POLLIN)
            accept_worker();
        if (sock >= 0 && (unplugged || (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))) {
            if (read_sock() < 0) {
                if (!vm && lfd < 0)
                    _exit(0); /* worker gone: ending init ends the sandbox */
                if (!vm)
                    disconnected(); /* a restarted worker connects again */
                else if (!unplugged)
                    disconnected(); /* the VM's host side went away (a worker restart,
                                       or its kill): wait for the next peer */
            } else {
                unplugged = 0;
            }
        }
        agent_proc_events(pfd + nj, n - nj);
        for (int i = 3; i < nj; i++) {
            if (!pfd[i].revents)
                continue;
            if (owner[i]) {
                if (owner[i]->used && owner[i]->fd[stream[i]] == pfd[i].fd)
                    drain(owner[i], stream[i]);
            } else {
                char buf[CHUNK];
                ssize_t r = read(pfd[i].fd, buf, sizeof(buf));
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    int k = stream[i];
                    close(orphans[k]);
                    orphans[k] = -1;
                }
            }
        }
        /* compact closed orphans */
        for (int i = 0, w = 0, total = n_orphans; i < total; i++) {
            if (orphans[i] >= 0)
                orphans[w++] = orphans[i];
            else
                n_orphans--;
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                ;
        }
        reap();
        check_timeouts(sf_mono_ms());
        for (int i = 0; i < JOBS_MAX; i++)
            if (jobs[i].used && jobs[i].stream)
                stream_flush(&jobs[i], 0, sf_mono_ms());
        if (outq.len && !unplugged && sock >= 0 && flush_sock() < 0) {
            if (lfd < 0)
                _exit(0);
            disconnected();
        }
    }
}
