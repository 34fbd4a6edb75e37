/* The jail driver end to end, through its operations table (worker/driver.h) on a
 * libevent loop and the worker's thread pool: real namespaces, overlay, cgroups,
 * seccomp and the real agent.
 * Needs root (exit 77 = skipped otherwise). Includes the driver's internal
 * header only to look at what a user cannot see from inside: the init's host
 * pid and the cgroup directories. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "jail_int.h"
#include "driver.h"
#include "jail.h"
#include "sf_agentproto.h"
#include "sf_util.h"

static struct event_base *base;
static wk_pool *pool;
static const wk_driver_ops *ops = &wk_jail_driver;
static wk_driver *drv;
static wk_host_cfg hcfg;
static char state_dir[64];
static int id_seq;

#define TEST_MEMORY (128ull << 20)
#define TEST_PIDS 128

/* ---- helpers ------------------------------------------------------------- */

typedef struct run {
    int done;
    int exit_code, timed_out, truncated, oom_killed;
    char *out, *err, *error;
    size_t out_len, err_len;
    uint64_t out_total, err_total;
    uint32_t duration_ms;
} run;

static char *dup_bytes(const char *p, size_t n)
{
    char *d = malloc(n + 1);
    assert_non_null(d);
    if (n)
        memcpy(d, p, n);
    d[n] = '\0';
    return d;
}

static void on_done(void *arg, const wk_exec_result *res)
{
    run *r = arg;

    assert_int_equal(r->done, 0); /* exactly once */
    r->done = 1;
    if (res->error) {
        r->error = dup_bytes(res->error, strlen(res->error));
        return;
    }
    r->exit_code = res->exit_code;
    r->timed_out = res->timed_out;
    r->oom_killed = res->oom_killed;
    r->truncated = res->truncated;
    r->out = dup_bytes(res->out, res->out_len);
    r->err = dup_bytes(res->err, res->err_len);
    r->out_len = res->out_len;
    r->err_len = res->err_len;
    r->out_total = res->out_total;
    r->err_total = res->err_total;
    r->duration_ms = res->duration_ms;
}

static void run_free(run *r)
{
    free(r->out);
    free(r->err);
    free(r->error);
    memset(r, 0, sizeof(*r));
}

static void wait_done(run *r)
{
    while (!r->done)
        assert_true(event_base_loop(base, EVLOOP_ONCE) == 0);
}

static void exec_full(wk_sandbox *sb, const char *cmd, const char *cwd, const char *const *env,
                      uint32_t timeout_ms, run *r)
{
    wk_exec_req req = {.command = cmd, .cwd = cwd, .env = env, .timeout_ms = timeout_ms,
                       .cap_bytes = 32768};
    memset(r, 0, sizeof(*r));
    assert_int_equal(ops->exec(sb, &req, on_done, r), 0);
    assert_int_equal(r->done, 0); /* never called from inside wk_sandbox_exec */
    wait_done(r);
}

/* Runs cmd, expects it to run (no error), returns its stdout (caller frees via run). */
static void sh(wk_sandbox *sb, const char *cmd, run *r)
{
    exec_full(sb, cmd, NULL, NULL, 20000, r);
    if (r->error)
        fail_msg("exec '%s' failed: %s", cmd, r->error);
}

typedef struct created {
    int done, rc;
    wk_sandbox *sb;
    char why[512];
} created;

static void on_created(void *arg, wk_sandbox *sb, int rc, const char *why)
{
    created *c = arg;

    assert_int_equal(c->done, 0);
    c->done = 1;
    c->rc = rc;
    c->sb = sb;
    snprintf(c->why, sizeof(c->why), "%s", why ? why : "");
}

/* Creates through the driver and runs the loop until it answered: 0 or its rc. */
static int try_create(wk_driver *d, const char *id, const wk_limits *lim, wk_sandbox **out,
                      char *why, size_t whylen)
{
    wk_create_req req = {.id = id};
    created c = {0};
    int rc;

    if (lim)
        req.limits = *lim;
    if ((rc = ops->create(d, &req, on_created, &c)) < 0)
        return rc;
    assert_int_equal(c.done, 0); /* never called from inside create */
    while (!c.done)
        assert_true(event_base_loop(base, EVLOOP_ONCE) == 0);
    snprintf(why, whylen, "%s", c.why);
    *out = c.sb;
    return c.rc;
}

static wk_sandbox *create_lim(const wk_limits *lim, char *id, size_t idsize)
{
    wk_sandbox *sb = NULL;
    char why[512];
    uint64_t t0;
    int rc;

    snprintf(id, idsize, "t%d-%d", (int)getpid(), ++id_seq);
    t0 = sf_mono_us();
    rc = try_create(drv, id, lim, &sb, why, sizeof(why));
    if (rc < 0)
        fail_msg("create %s: rc=%d why=%s", id, rc, why);
    printf("# create %s: %.2f ms\n", id, (double)(sf_mono_us() - t0) / 1000.0);
    assert_non_null(sb);
    return sb;
}

static wk_sandbox *create(char *id, size_t idsize)
{
    return create_lim(NULL, id, idsize);
}

static void on_killed(void *arg, int rc)
{
    int *done = arg;
    assert_int_equal(rc, 0);
    (*done)++;
}

/* Kills and runs the loop until the teardown ended. */
static void kill_wait(wk_sandbox *sb)
{
    int done = 0;

    ops->kill(sb, on_killed, &done);
    while (!done)
        assert_true(event_base_loop(base, EVLOOP_ONCE) == 0);
    assert_int_equal(done, 1);
}

static int path_exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static long read_long(const char *dir, const char *file)
{
    char path[512], buf[64] = {0};
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    f = fopen(path, "r");
    if (!f)
        return -1;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    return strtol(buf, NULL, 10);
}

/* Host pids in the sandbox's cgroup (pids hierarchy, or the v2 group). */
static int cgroup_pids(wk_sandbox *sb, pid_t *pids, int max)
{
    const char *dir = sb->cg.v2 ? sb->cg.dir[0] : sb->cg.dir[WK_CG_PIDS];
    char path[512], line[64];
    int n = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    f = fopen(path, "r");
    assert_non_null(f);
    while (n < max && fgets(line, sizeof(line), f))
        pids[n++] = (pid_t)strtol(line, NULL, 10);
    fclose(f);
    return n;
}

/* The loop device the sandbox's disk is mounted from (from our mountinfo), or "". */
static void disk_device(const wk_sandbox *sb, char *dev, size_t n)
{
    char line[4096], mnt[WK_PATH_MAX + 8];
    FILE *f = fopen("/proc/self/mountinfo", "r");

    dev[0] = '\0';
    snprintf(mnt, sizeof(mnt), " %s/fs ", sb->sbdir);
    while (f && fgets(line, sizeof(line), f)) {
        char *dash = strstr(line, " - ext4 ");
        if (!strstr(line, mnt) || !dash)
            continue;
        if (sscanf(dash + 8, "%63s", dev) != 1)
            dev[0] = '\0';
    }
    if (f)
        fclose(f);
}

/* Whether a loop device still has a backing file whose path contains `needle`. */
static int loop_backs(const char *dev, const char *needle)
{
    char path[128], buf[WK_PATH_MAX] = "";
    FILE *f;

    snprintf(path, sizeof(path), "/sys/block/%s/loop/backing_file", strrchr(dev, '/') + 1);
    if (!(f = fopen(path, "r")))
        return 0;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    return strstr(buf, needle) != NULL;
}

/* Polls cond for up to 10 s (the kernel releases a detached loop device by itself). */
#define WAIT_FOR(cond)                                                                        \
    do {                                                                                      \
        for (int w_ = 0; w_ < 1000 && !(cond); w_++)                                          \
            usleep(10000);                                                                    \
    } while (0)

/* ---- fixture ------------------------------------------------------------- */

static int group_setup(void **state)
{
    const char *why = NULL;
    uint64_t t0;
    int rc;

    snprintf(state_dir, sizeof(state_dir), "/tmp/sf-jail-test-XXXXXX");
    assert_non_null(mkdtemp(state_dir));
    if (!(base = event_base_new()) || !(pool = wk_pool_new(base, 2)))
        return -1;
    hcfg = (wk_host_cfg){
        .base = base,
        .pool = pool,
        .host_id = "jailtest",
        .state_dir = state_dir,
        .agent_path = SF_AGENT_PATH,
        .defaults = {.memory_mib = TEST_MEMORY >> 20, .vcpu_milli = 1000, .disk_mib = 256,
                     .pids_max = TEST_PIDS, .inodes = 65536},
        .host_share_pct = 100,
        .reserve_mem_mib = 0,
        .cpu_overcommit_pct = 100,
        .nofile = 1024,
        .uid_base = 200000,
        .pool_images = 2,
    };
    t0 = sf_mono_us();
    wk_host_measure(&hcfg); /* as the daemon does */
    rc = ops->host_init(&hcfg, &drv, &why);
    if (rc < 0) {
        fprintf(stderr, "host_init: rc=%d why=%s\n", rc, why ? why : "");
        return -1;
    }
    printf("# host init (template build): %.1f ms\n", (double)(sf_mono_us() - t0) / 1000.0);
    return 0;
}

static int group_teardown(void **state)
{
    ops->host_fini(drv);
    wk_pool_free(pool);
    event_base_free(base);
    return wk_rmtree(state_dir) == 0 ? 0 : -1;
}

/* ---- tests --------------------------------------------------------------- */

static void test_exec_streams_and_exit_code(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    sh(sb, "echo hello; echo oops >&2; exit 3", &r);
    assert_string_equal(r.out, "hello\n");
    assert_string_equal(r.err, "oops\n");
    assert_int_equal(r.exit_code, 3);
    assert_int_equal(r.out_total, 6);
    assert_int_equal(r.err_total, 5);
    assert_false(r.truncated);
    assert_false(r.timed_out);
    run_free(&r);
    kill_wait(sb);
}

static void test_one_mebibyte_is_truncated(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    sh(sb, "head -c 1048576 /dev/zero | tr '\\0' a", &r);
    assert_int_equal(r.exit_code, 0);
    assert_true(r.truncated);
    assert_int_equal(r.out_len, 32768);
    assert_int_equal(r.out_total, 1048576);
    for (size_t i = 0; i < r.out_len; i++)
        if (r.out[i] != 'a')
            fail_msg("byte %zu is %d, not 'a'", i, r.out[i]);
    run_free(&r);
    kill_wait(sb);
}

static void test_timeout_kills_the_process_group(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    exec_full(sb, "sleep 5", NULL, NULL, 500, &r);
    assert_null(r.error);
    assert_true(r.timed_out);
    assert_int_equal(r.exit_code, -1);
    assert_true(r.duration_ms >= 500 && r.duration_ms < 3000);
    run_free(&r);
    /* with a child of the shell too */
    exec_full(sb, "sleep 7 & sleep 6; echo never", NULL, NULL, 300, &r);
    assert_true(r.timed_out);
    assert_null(strstr(r.out, "never"));
    run_free(&r);
    sh(sb, "ps -o pid,args", &r);
    if (strstr(r.out, "sleep"))
        fail_msg("sleep survived its timeout:\n%s", r.out);
    run_free(&r);
    kill_wait(sb);
}

static void test_sees_only_its_own_processes(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    sh(sb, "ps -o pid,args", &r);
    /* header, agent, sh, ps */
    if (count_lines(r.out) > 4)
        fail_msg("ps shows more than the sandbox's processes:\n%s", r.out);
    assert_non_null(strstr(r.out, "    1 /sbin/sandfleet-agent"));
    assert_null(strstr(r.out, "test_jail"));
    run_free(&r);
    sh(sb, "ls /proc | grep -c '^[0-9]'", &r);
    assert_true(atoi(r.out) <= 4);
    run_free(&r);
    kill_wait(sb);
}

static void test_host_files_are_invisible(void **state)
{
    char id[64], host_hostname[256] = "", want[80];
    wk_sandbox *sb = create(id, sizeof(id));
    FILE *f = fopen("/etc/hostname", "r");
    run r;

    if (f) {
        if (!fgets(host_hostname, sizeof(host_hostname), f))
            host_hostname[0] = '\0';
        fclose(f);
    }
    sh(sb, "ls /work", &r);
    assert_int_not_equal(r.exit_code, 0);
    run_free(&r);
    sh(sb, "cat /etc/hostname", &r);
    assert_string_equal(r.out, "sandbox\n");
    if (host_hostname[0] && strcmp(host_hostname, "sandbox\n") != 0)
        assert_string_not_equal(r.out, host_hostname);
    run_free(&r);
    sh(sb, "hostname", &r);
    snprintf(want, sizeof(want), "%s\n", id);
    assert_string_equal(r.out, want);
    run_free(&r);
    /* The host's root has these; the template does not. */
    sh(sb, "ls / | tr '\\n' ' '; test -e /usr/bin/cmake || test -e /lib/x86_64-linux-gnu/libc.so.6 "
           "|| test -e " SF_AGENT_PATH " && echo HOST-VISIBLE", &r);
    assert_null(strstr(r.out, "HOST-VISIBLE"));
    assert_null(strstr(r.out, "work"));
    run_free(&r);
    /* The old root is gone from the mount table. */
    sh(sb, "cat /proc/self/mounts", &r);
    assert_null(strstr(r.out, state_dir));
    assert_null(strstr(r.out, " /work"));
    /* /, proc + 7 lxcfs files, dev + 6 nodes, shm, pts */
    assert_true(count_lines(r.out) <= 18);
    run_free(&r);
    kill_wait(sb);
}

/* The sandbox sees its own limits (lxcfs, its own disk) and no host path in its mount
 * table. */
static void test_proc_shows_the_sandbox(void **state)
{
    char id[64], want[64];
    wk_sandbox *sb = create(id, sizeof(id));
    long kb;
    run r;

    if (!wk_lxcfs_alive(&drv->lxcfs)) {
        kill_wait(sb);
        skip(); /* lxcfs is not installed here */
    }
    sh(sb, "awk '/^MemTotal:/ {print $2}' /proc/meminfo", &r);
    snprintf(want, sizeof(want), "%llu\n", (unsigned long long)(TEST_MEMORY >> 10));
    assert_string_equal(r.out, want);
    run_free(&r);
    sh(sb, "grep -c ^processor /proc/cpuinfo; cut -d. -f1 /proc/uptime", &r);
    if (strncmp(r.out, "1\n", 2) != 0)
        fail_msg("cpuinfo/uptime: %s", r.out); /* 1000 mcpu: one CPU */
    assert_true(atol(r.out + 2) < 60);           /* up since the sandbox started */
    run_free(&r);
    sh(sb, "df -k / | tail -1 | awk '{print $2}'", &r);
    kb = atol(r.out);
    assert_true(kb > 200 * 1024 && kb <= 256 * 1024); /* its own 256 MiB disk */
    run_free(&r);
    sh(sb, "cat /proc/self/mountinfo", &r);
    if (strstr(r.out, state_dir) || strstr(r.out, SF_AGENT_PATH) || strstr(r.out, "/work") ||
        strstr(r.out, "/tmp/"))
        fail_msg("a host path in the sandbox's mountinfo:\n%s", r.out);
    assert_non_null(strstr(r.out, " /proc/meminfo ")); /* lxcfs's, bound over /proc's */
    run_free(&r);
    kill_wait(sb);
}

static void test_template_is_read_only_but_tmp_and_root_are_writable(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    sh(sb, "id -u", &r);
    assert_string_equal(r.out, "0\n");
    run_free(&r);
    sh(sb, "touch /bin/x", &r);
    assert_int_not_equal(r.exit_code, 0);
    assert_non_null(strstr(r.err, "Permission denied"));
    run_free(&r);
    sh(sb, "rm /bin/busybox; echo x > /etc/passwd; test -e /bin/x", &r);
    assert_int_not_equal(r.exit_code, 0);
    run_free(&r);
    sh(sb, "head -c 10 /bin/busybox | wc -c; grep -c root /etc/passwd", &r);
    assert_string_equal(r.out, "10\n1\n");
    run_free(&r);
    sh(sb, "echo x > /tmp/y && cat /tmp/y", &r);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.out, "x\n");
    run_free(&r);
    sh(sb, "cd && pwd && echo hi > f && cat f && mkdir -p /home/u/d && echo ok", &r);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.out, "/root\nhi\nok\n");
    run_free(&r);
    sh(sb, "echo > /dev/null && head -c 4 /dev/urandom | wc -c && head -c 3 /dev/zero | wc -c", &r);
    assert_string_equal(r.out, "4\n3\n");
    run_free(&r);
    kill_wait(sb);
}

static void test_network_has_only_lo(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    sh(sb, "ip link | grep -c '^[0-9]'", &r);
    assert_string_equal(r.out, "1\n");
    run_free(&r);
    sh(sb, "ip link", &r);
    assert_non_null(strstr(r.out, "1: lo: <LOOPBACK,UP,LOWER_UP>"));
    run_free(&r);
    sh(sb, "cat /proc/net/dev", &r);
    assert_int_equal(count_lines(r.out), 3); /* two header lines + lo */
    assert_non_null(strstr(r.out, "lo:"));
    run_free(&r);
    sh(sb, "ping -c 1 -W 1 127.0.0.1", &r); /* lo is up */
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, "1 packets received"));
    run_free(&r);
    sh(sb, "nc -w 1 1.1.1.1 80 < /dev/null", &r); /* nothing else is reachable */
    assert_int_not_equal(r.exit_code, 0);
    assert_non_null(strstr(r.err, "Network is unreachable"));
    run_free(&r);
    kill_wait(sb);
}

static void test_seccomp_no_new_privs_and_caps(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    unsigned long long bnd = 0;
    run r;

    sh(sb, "grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/self/status", &r);
    assert_non_null(strstr(r.out, "NoNewPrivs:\t1"));
    assert_non_null(strstr(r.out, "Seccomp:\t2"));
    assert_non_null(strstr(r.out, "CapBnd:"));
    bnd = strtoull(strstr(r.out, "CapBnd:") + 7, NULL, 16);
    assert_false(bnd & (1ull << 21)); /* CAP_SYS_ADMIN */
    assert_false(bnd & (1ull << 12)); /* CAP_NET_ADMIN */
    assert_false(bnd & (1ull << 19)); /* CAP_SYS_PTRACE */
    assert_true(bnd & (1ull << 0));   /* CAP_CHOWN kept */
    run_free(&r);
    sh(sb, "mount -t tmpfs none /mnt; echo rc=$?", &r);
    assert_string_equal(r.out, "rc=1\n");
    run_free(&r);
    sh(sb, "unshare -U true 2>&1; echo rc=$?", &r);
    assert_non_null(strstr(r.out, "Operation not permitted"));
    run_free(&r);
    sh(sb, "unshare -m true 2>&1; echo rc=$?", &r); /* no CAP_SYS_ADMIN left */
    assert_null(strstr(r.out, "rc=0"));
    run_free(&r);
    sh(sb, "ip link set lo down 2>&1; echo rc=$?", &r); /* no CAP_NET_ADMIN */
    assert_null(strstr(r.out, "rc=0"));
    run_free(&r);
    kill_wait(sb);
}

/* Tasks of a cgroup directory. */
static int group_has(const char *dir, pid_t pid)
{
    char path[512], line[64];
    int found = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    if (!(f = fopen(path, "r")))
        return 0;
    while (fgets(line, sizeof(line), f))
        found |= (pid_t)strtol(line, NULL, 10) == pid;
    fclose(f);
    return found;
}

static void test_cgroup_limits(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    long box = (long)(TEST_MEMORY - wk_agent_reserve(TEST_MEMORY));
    run r;

    if (sb->cg.v2) {
        assert_int_equal(read_long(sb->cg.dir[0], "memory.max"), (long)TEST_MEMORY);
        assert_int_equal(read_long(sb->cg.box, "memory.max"), box);
        assert_int_equal(read_long(sb->cg.dir[0], "pids.max"), TEST_PIDS);
    } else {
        const char *mem = sb->cg.dir[WK_CG_MEMORY], *cpu = sb->cg.dir[WK_CG_CPU];
        assert_int_equal(read_long(mem, "memory.limit_in_bytes"), (long)TEST_MEMORY);
        assert_int_equal(read_long(sb->cg.box, "memory.limit_in_bytes"), box);
        if (wk_cgroup_tcp_apart())
            assert_int_equal(read_long(mem, "memory.kmem.tcp.limit_in_bytes"),
                             (long)wk_tcp_limit(TEST_MEMORY));
        assert_int_equal(read_long(sb->cg.dir[WK_CG_PIDS], "pids.max"), TEST_PIDS);
        assert_int_equal(read_long(cpu, "cpu.cfs_quota_us"), 100000); /* 1000 mcpu */
        assert_int_equal(read_long(cpu, "cpu.cfs_period_us"), 100000);
        assert_int_equal(read_long(cpu, "cpu.shares"), 1024);
        assert_true(path_exists(sb->cg.dir[WK_CG_FREEZER]));
    }
    {
        pid_t pids[16];
        int n = cgroup_pids(sb, pids, 16);
        assert_int_equal(n, 1); /* the init, already inside */
        assert_int_equal(pids[0], sb->pid);
    }
    /* the agent stays out of the box; its commands go in */
    assert_true(group_has(sb->cg.v2 ? sb->cg.agent : sb->cg.dir[WK_CG_MEMORY], sb->pid));
    assert_false(group_has(sb->cg.box, sb->pid));
    sh(sb, "sleep 30 >/dev/null 2>&1 & echo $!", &r);
    run_free(&r);
    {
        pid_t pids[16];
        int n = cgroup_pids(sb, pids, 16), in_box = 0;
        for (int i = 0; i < n; i++)
            if (pids[i] != sb->pid)
                in_box += group_has(sb->cg.box, pids[i]);
        assert_int_equal(n, 2);
        assert_int_equal(in_box, 1);
    }
    /* A shell variable of 200 MB does not fit in the box: the OOM killer ends the
     * command, not the agent, and the result says so. */
    sh(sb, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived", &r);
    assert_null(strstr(r.out, "survived"));
    assert_int_equal(r.exit_code, 128 + SIGKILL);
    assert_int_equal(r.oom_killed, 1);
    run_free(&r);
    sh(sb, "echo still-here; cat /proc/1/cmdline", &r);
    assert_non_null(strstr(r.out, "still-here\n/sbin/sandfleet-agent"));
    assert_int_equal(r.oom_killed, 0);
    run_free(&r);
    kill_wait(sb);
}

/* /dev/shm pages outlive the processes that wrote them: they are charged to the box,
 * and /dev/shm holds half of it, so a fill stops with ENOSPC, the box never passes
 * its limit and there is room left to clean up. */
static void test_shm_fill_is_stopped_by_the_box(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    long limit = (long)(TEST_MEMORY - wk_agent_reserve(TEST_MEMORY));
    const char *max = sb->cg.v2 ? "memory.peak" : "memory.max_usage_in_bytes";
    run r;

    sh(sb, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=200; echo rc=$?", &r);
    if (strstr(r.out, "rc=0") || !strstr(r.err, "No space left on device"))
        fail_msg("the fill was not stopped by ENOSPC: exit=%d out=%s err=%s", r.exit_code, r.out,
                 r.err);
    run_free(&r);
    if (read_long(sb->cg.box, max) >= 0)
        assert_true(read_long(sb->cg.box, max) <= limit);
    sh(sb, "rm -f /dev/shm/fill; head -c 1000000 /dev/zero > /dev/shm/ok && echo fine; "
           "cat /proc/1/cmdline", &r);
    assert_string_equal(r.out, "fine\n/sbin/sandfleet-agent");
    run_free(&r);
    kill_wait(sb);
}

/* A command longer than Linux takes as one exec argument (128 KiB) runs. */
static void test_long_command(void **state)
{
    enum { N = 150 * 1024 };
    char id[64], *cmd = malloc(N + 64);
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    assert_non_null(cmd);
    memcpy(cmd, "echo ", 5);
    memset(cmd + 5, 'x', N);
    strcpy(cmd + 5 + N, " | wc -c; echo $0");
    sh(sb, cmd, &r);
    assert_string_equal(r.out, "153601\nsh\n");
    assert_int_equal(r.exit_code, 0);
    run_free(&r);
    free(cmd);
    kill_wait(sb);
}

/* Open files and /dev/shm are bounded too. */
static void test_nofile_and_shm(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    long box_kib = (long)((TEST_MEMORY - wk_agent_reserve(TEST_MEMORY)) >> 10) / 2;
    char want[64];
    run r;

    sh(sb, "ulimit -n; ulimit -Hn; df -k /dev/shm | tail -1 | awk '{print $2}'", &r);
    snprintf(want, sizeof(want), "1024\n1024\n%ld\n", box_kib);
    assert_string_equal(r.out, want);
    run_free(&r);
    kill_wait(sb);
}

#ifdef SF_PROBE_PATH
/* Only AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (route) sockets open, also through
 * the i386 system call entry. */
static void test_socket_families(void **state)
{
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"1 1 0", "ok"},         {"2 2 0", "ok"},           {"10 2 0", "ok"},
        {"16 3 0", "ok"},        {"40 1 0", "errno 97"},    {"17 3 0", "errno 97"},
        {"44 3 0", "errno 97"},  {"16 3 9", "errno 97"},    {"5 2 0", "errno 97"},
        {"4294967336 1 0", "errno 97"}, {"40 1 0 int80", "errno 97"},
        {"17 3 0 int80", "errno 97"}, {"2 2 0 int80", "ok"},
    };
    char id[64], dst[WK_PATH_MAX + 32], cmd[128];
    wk_sandbox *sb = create(id, sizeof(id));
    int in, out;
    char buf[65536];
    ssize_t n;
    run r;

    snprintf(dst, sizeof(dst), "%s/fs/upper/root/probe", sb->sbdir);
    assert_true((in = open(SF_PROBE_PATH, O_RDONLY)) >= 0);
    assert_true((out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0755)) >= 0);
    while ((n = read(in, buf, sizeof(buf))) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(cmd, sizeof(cmd), "/root/probe %s", cases[i].args);
        sh(sb, cmd, &r);
        if (strncmp(r.out, cases[i].want, strlen(cases[i].want)) != 0)
            fail_msg("socket(%s): %s (want %s)", cases[i].args, r.out, cases[i].want);
        run_free(&r);
    }
    kill_wait(sb);
}
#endif

static void test_fork_bomb_is_contained(void **state)
{
    /* Room in memory, so that pids.max is what stops it (not the OOM killer). */
    wk_limits big = {.memory_mib = 1024};
    char id[64];
    wk_sandbox *sb;

    sb = create_lim(&big, id, sizeof(id));
    const char *pdir;
    run r;

    exec_full(sb, "f() { while :; do f & done; }; f & exec sleep 60", NULL, NULL, 2000, &r);
    assert_null(r.error);
    if (!r.timed_out)
        fail_msg("the bomb ended by itself: exit=%d ms=%u err tail=%s", r.exit_code,
                 r.duration_ms, r.err_len > 200 ? r.err + r.err_len - 200 : r.err);
    assert_non_null(strstr(r.err, "can't fork")); /* it hit pids.max */
    run_free(&r);
    sh(sb, "echo alive", &r);
    assert_string_equal(r.out, "alive\n");
    run_free(&r);
    sh(sb, "ps -o args | grep -c '^sh -c f()'", &r); /* the bomb is gone */
    assert_string_equal(r.out, "0\n");
    run_free(&r);
    /* The host's count drops once the kernel has released the dead tasks. */
    pdir = sb->cg.v2 ? sb->cg.dir[0] : sb->cg.dir[WK_CG_PIDS];
    for (int i = 0; i < 200 && read_long(pdir, "pids.current") > 1; i++)
        usleep(10000);
    assert_int_equal(read_long(pdir, "pids.current"), 1);
    kill_wait(sb);
}

static void test_sandboxes_are_isolated_from_each_other(void **state)
{
    char ida[64], idb[64], want[128];
    wk_sandbox *a = create(ida, sizeof(ida)), *b = create(idb, sizeof(idb));
    run r, ra, rb;

    assert_int_not_equal(a->host_uid, b->host_uid);
    sh(a, "echo secret > /tmp/only-a; echo secret > /root/only-a", &r);
    run_free(&r);
    sh(b, "cat /tmp/only-a /root/only-a 2>&1; ls /tmp /root", &r);
    assert_null(strstr(r.out, "secret"));
    run_free(&r);
    /* b's processes are not in a's pid namespace. */
    sh(b, "sleep 30 > /dev/null 2>&1 & p=$!; "
          "while [ \"$(cat /proc/$p/comm)\" != sleep ]; do :; done; echo $p", &rb);
    run_free(&rb);
    sh(b, "ps -o args | grep -cx 'sleep 30'", &rb);
    assert_string_equal(rb.out, "1\n");
    run_free(&rb);
    sh(a, "ps -o args | grep -cx 'sleep 30'", &r);
    assert_string_equal(r.out, "0\n");
    run_free(&r);
    sh(a, "cat /proc/self/uid_map", &ra);
    sh(b, "cat /proc/self/uid_map", &rb);
    assert_string_not_equal(ra.out, rb.out);
    snprintf(want, sizeof(want), "%u", a->host_uid);
    assert_non_null(strstr(ra.out, want));
    run_free(&ra);
    run_free(&rb);
    kill_wait(a);
    kill_wait(b);
}

static void test_concurrent_execs(void **state)
{
    char id[64], cmd[4][64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r[4];
    int64_t t0 = sf_mono_ms();

    for (int i = 0; i < 4; i++) {
        wk_exec_req req = {.command = cmd[i], .timeout_ms = 10000, .cap_bytes = 32768};
        snprintf(cmd[i], sizeof(cmd[i]), "sleep 0.6; echo job%d", i);
        memset(&r[i], 0, sizeof(r[i]));
        assert_int_equal(ops->exec(sb, &req, on_done, &r[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        wait_done(&r[i]);
    printf("# 4 concurrent 0.6 s execs: %lld ms\n", (long long)(sf_mono_ms() - t0));
    assert_true(sf_mono_ms() - t0 < 2000);
    for (int i = 0; i < 4; i++) {
        char want[16];
        assert_null(r[i].error);
        snprintf(want, sizeof(want), "job%d\n", i);
        assert_string_equal(r[i].out, want);
        run_free(&r[i]);
    }
    kill_wait(sb);
}

static void test_exec_limit_per_sandbox(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    wk_exec_req req = {.command = "sleep 0.3", .timeout_ms = 10000};
    run r[WK_EXECS_MAX], extra = {0};

    for (int i = 0; i < WK_EXECS_MAX; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        assert_int_equal(ops->exec(sb, &req, on_done, &r[i]), 0);
    }
    assert_int_equal(ops->exec(sb, &req, on_done, &extra), -EBUSY);
    for (int i = 0; i < WK_EXECS_MAX; i++) {
        wait_done(&r[i]);
        if (r[i].error)
            fail_msg("exec %d: %s", i, r[i].error);
        assert_int_equal(r[i].exit_code, 0);
        run_free(&r[i]);
    }
    assert_int_equal(ops->exec(sb, &req, on_done, &extra), 0);
    wait_done(&extra);
    run_free(&extra);
    kill_wait(sb);
}

/* A frozen sandbox cannot answer: the worker-side deadline (timeout + 5 s)
 * fails the exec, and kill still works (it thaws first). */
static void test_unanswered_exec_and_kill_of_a_frozen_sandbox(void **state)
{
    char id[64], dir[WK_PATH_MAX];
    wk_sandbox *sb = create(id, sizeof(id));
    const char *fz = sb->cg.v2 ? sb->cg.dir[0] : sb->cg.dir[WK_CG_FREEZER];
    char path[512];
    int64_t t0;
    FILE *f;
    run r;

    if (!fz[0]) {
        kill_wait(sb);
        skip();
    }
    snprintf(path, sizeof(path), "%s/%s", fz, sb->cg.v2 ? "cgroup.freeze" : "freezer.state");
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(sb->cg.v2 ? "1" : "FROZEN", f);
    assert_int_equal(fclose(f), 0);
    t0 = sf_mono_ms();
    exec_full(sb, "echo hi", NULL, NULL, 200, &r);
    assert_non_null(r.error);
    assert_non_null(strstr(r.error, "did not answer"));
    assert_true(sf_mono_ms() - t0 >= 200 + WK_EXEC_GRACE_MS - 50);
    run_free(&r);
    snprintf(dir, sizeof(dir), "%s", sb->sbdir);
    kill_wait(sb);
    assert_false(path_exists(dir));
}

static void test_cwd_and_env(void **state)
{
    const char *env[] = {"FOO=bar", "HOME=/tmp", NULL};
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    run r;

    exec_full(sb, "pwd", NULL, NULL, 5000, &r);
    assert_string_equal(r.out, "/root\n");
    run_free(&r);
    exec_full(sb, "pwd", "", NULL, 5000, &r); /* empty = default */
    assert_string_equal(r.out, "/root\n");
    run_free(&r);
    exec_full(sb, "pwd", "/tmp", NULL, 5000, &r);
    assert_string_equal(r.out, "/tmp\n");
    run_free(&r);
    exec_full(sb, "echo \"$FOO $HOME $TERM\"; echo $PATH", NULL, env, 5000, &r);
    assert_string_equal(r.out, "bar /tmp xterm\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    run_free(&r);
    exec_full(sb, "true", "/nonexistent", NULL, 5000, &r);
    assert_non_null(r.error);
    assert_non_null(strstr(r.error, "/nonexistent"));
    assert_non_null(strstr(r.error, "does not exist"));
    run_free(&r);
    sh(sb, "echo still-fine", &r);
    assert_string_equal(r.out, "still-fine\n");
    run_free(&r);
    kill_wait(sb);
}

static void test_bad_requests_are_refused(void **state)
{
    const char *bad_env[] = {"NOEQUALS", NULL};
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id)), *other = NULL;
    wk_exec_req req = {.command = "true"};
    char why[512];
    run r = {0};

    assert_int_equal(try_create(drv, "Bad/Id", NULL, &other, why, sizeof(why)), -EINVAL);
    assert_int_equal(try_create(drv, id, NULL, &other, why, sizeof(why)), -EEXIST);
    assert_int_equal(try_create(drv, "fine", &(wk_limits){.memory_mib = 1}, &other, why,
                                sizeof(why)), -EINVAL);
    assert_null(other);
    assert_int_equal(ops->exec(sb, &(wk_exec_req){.command = NULL}, on_done, &r), -EINVAL);
    assert_int_equal(ops->exec(sb, &req, NULL, &r), -EINVAL);
    req.env = bad_env;
    assert_int_equal(ops->exec(sb, &req, on_done, &r), -EINVAL);
    req.env = NULL;
    {
        char *huge = malloc(SF_AP_FRAME_MAX + 1);
        assert_non_null(huge);
        memset(huge, ':', SF_AP_FRAME_MAX);
        huge[SF_AP_FRAME_MAX] = '\0';
        req.command = huge;
        assert_int_equal(ops->exec(sb, &req, on_done, &r), -E2BIG);
        free(huge);
    }
    assert_int_equal(r.done, 0);
    sh(sb, "echo ok", &r); /* the failed create did not hurt the first one */
    assert_string_equal(r.out, "ok\n");
    run_free(&r);
    kill_wait(sb);
    ops->kill(NULL, NULL, NULL);
}

static void test_agent_death_fails_pending_and_later_execs(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    wk_exec_req req = {.command = "sleep 30", .timeout_ms = 60000};
    run pending = {0}, later = {0};

    assert_int_equal(ops->exec(sb, &req, on_done, &pending), 0);
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(kill(sb->pid, SIGKILL), 0); /* the jail's init dies */
    wait_done(&pending);
    assert_non_null(pending.error);
    assert_non_null(strstr(pending.error, "agent"));
    req.command = "echo hi";
    assert_int_equal(ops->exec(sb, &req, on_done, &later), 0);
    assert_int_equal(later.done, 0);
    wait_done(&later);
    assert_non_null(later.error);
    run_free(&pending);
    run_free(&later);
    kill_wait(sb);
}

static void test_kill_fails_pending_execs(void **state)
{
    char id[64];
    wk_sandbox *sb = create(id, sizeof(id));
    wk_exec_req req = {.command = "sleep 30", .timeout_ms = 60000};
    run r = {0};

    assert_int_equal(ops->exec(sb, &req, on_done, &r), 0);
    event_base_loop(base, EVLOOP_NONBLOCK);
    kill_wait(sb);
    assert_int_equal(r.done, 1);
    assert_string_equal(r.error, "The sandbox was killed while the command ran.");
    run_free(&r);
}

static int killed_from_callback;

static void kill_from_callback(void *arg, const wk_exec_result *res)
{
    wk_sandbox **sb = arg;
    ops->kill(*sb, on_killed, &killed_from_callback);
    *sb = NULL;
}

static void test_kill_from_inside_a_callback(void **state)
{
    char id[64], dir[WK_PATH_MAX];
    wk_sandbox *sb = create(id, sizeof(id)), *keep = sb;
    wk_exec_req req = {.command = "echo bye", .timeout_ms = 5000};

    snprintf(dir, sizeof(dir), "%s", sb->sbdir);
    assert_int_equal(ops->exec(sb, &req, kill_from_callback, &keep), 0);
    while (!killed_from_callback)
        assert_true(event_base_loop(base, EVLOOP_ONCE) == 0);
    assert_null(keep);
    assert_false(path_exists(dir));
}

static void test_kill_leaves_nothing_behind(void **state)
{
    char id[64], dir[WK_PATH_MAX], cg[WK_CG_N][320], line[512];
    wk_sandbox *sb = create(id, sizeof(id));
    pid_t pids[64];
    int n;
    FILE *f;
    run r;

    sh(sb, "sleep 100 > /dev/null 2>&1 & sleep 101 > /dev/null 2>&1 & echo started", &r);
    run_free(&r);
    n = cgroup_pids(sb, pids, 64);
    assert_true(n >= 3); /* init + two sleeps */
    snprintf(dir, sizeof(dir), "%s", sb->sbdir);
    memcpy(cg, sb->cg.dir, sizeof(cg));
    assert_true(path_exists(dir));
    kill_wait(sb);
    assert_false(path_exists(dir));
    for (int c = 0; c < WK_CG_N; c++)
        if (cg[c][0])
            assert_false(path_exists(cg[c]));
    for (int i = 0; i < n; i++) {
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d", (int)pids[i]);
        if (path_exists(p))
            fail_msg("process %d of the sandbox is still there", (int)pids[i]);
    }
    f = fopen("/proc/self/mountinfo", "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strstr(line, id))
            fail_msg("host mount left behind: %s", line);
    fclose(f);
}

/* The sandbox's disk is a filesystem of its own: writing past its size or its
 * inode count fails inside with ENOSPC, and the image file never allocates more
 * than its size. */
static void test_disk_and_inode_quota(void **state)
{
    wk_limits small = {.disk_mib = 64, .inodes = 4096};
    char id[64], img[WK_PATH_MAX + 16];
    wk_sandbox *sb = create_lim(&small, id, sizeof(id));
    struct stat st;
    run r;

    sh(sb, "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1; echo rc=$?; df -k / | tail -1", &r);
    assert_non_null(strstr(r.out, "No space left on device"));
    assert_non_null(strstr(r.out, "rc=1"));
    run_free(&r);
    snprintf(img, sizeof(img), "%s/" WK_DISK_IMAGE, sb->sbdir);
    assert_int_equal(stat(img, &st), 0);
    assert_int_equal(st.st_size, 64ll << 20);
    assert_true((long long)st.st_blocks * 512 <= 64ll << 20);
    sh(sb, "rm /root/big; mkdir /root/many && cd /root/many && i=0; "
           "while [ $i -lt 5000 ]; do touch f$i 2>/dev/null || break; i=$((i+1)); done; echo made=$i", &r);
    {
        const char *m = strstr(r.out, "made=");
        if (!m)
            fail_msg("out=%s err=%s", r.out, r.err);
        assert_true(atoi(m + 5) < 4096);
    }
    run_free(&r);
    sh(sb, "rm -rf /root/many && echo ok > /root/after && cat /root/after", &r);
    assert_string_equal(r.out, "ok\n"); /* space comes back */
    run_free(&r);
    assert_int_equal(stat(img, &st), 0);
    assert_true((long long)st.st_blocks * 512 <= 64ll << 20);
    kill_wait(sb);
}

/* The teardown runs in a child process: stopped half-way, the worker's loop goes on
 * serving other sandboxes; continued, it leaves nothing (directory, image, mount,
 * loop device, cgroups). */
static void test_teardown_in_a_child_can_be_stopped(void **state)
{
    char ida[64], idb[64], dir[WK_PATH_MAX], dev[64], line[256], cg[WK_CG_N][320];
    wk_sandbox *a = create(ida, sizeof(ida)), *b = create(idb, sizeof(idb));
    int done = 0;
    pid_t td = 0;
    FILE *f;
    run r;

    sh(a, "mkdir -p /root/t && cd /root/t && for i in $(seq 2000); do mkdir d$i; : > d$i/f; done", &r);
    run_free(&r);
    snprintf(dir, sizeof(dir), "%s", a->sbdir);
    memcpy(cg, a->cg.dir, sizeof(cg));
    disk_device(a, dev, sizeof(dev));
    assert_true(dev[0] != '\0');
    assert_true(loop_backs(dev, ida));
    drv->teardown_stop = 1; /* read when the teardown starts */
    ops->kill(a, on_killed, &done);
    /* the child appears once the pid namespace is gone */
    for (int i = 0; i < 1000 && !td; i++) {
        wk_sandbox *s;
        event_base_loop(base, EVLOOP_NONBLOCK);
        for (s = drv->all; s && strcmp(s->id, ida) != 0; s = s->next)
            ;
        if (s && s->td_pidfd >= 0) {
            char fdinfo[64];
            snprintf(fdinfo, sizeof(fdinfo), "/proc/self/fdinfo/%d", s->td_pidfd);
            f = fopen(fdinfo, "r");
            while (f && fgets(line, sizeof(line), f))
                if (!strncmp(line, "Pid:", 4))
                    td = (pid_t)atoi(line + 4);
            if (f)
                fclose(f);
        }
        if (!td)
            usleep(5000);
    }
    drv->teardown_stop = 0;
    assert_true(td > 0);
    {
        char statp[64], st[512] = "";
        snprintf(statp, sizeof(statp), "/proc/%d/stat", (int)td);
        for (int i = 0; i < 1000; i++) {
            f = fopen(statp, "r");
            assert_non_null(f);
            assert_non_null(fgets(st, sizeof(st), f));
            fclose(f);
            if (strstr(st, ") T "))
                break;
            usleep(5000);
        }
        assert_non_null(strstr(st, "(sf-teardown) T ")); /* stopped half-way */
    }
    /* half-way: the cgroups are gone, the disk is not */
    assert_true(path_exists(dir));
    for (int c = 0; c < WK_CG_N; c++)
        if (cg[c][0])
            assert_false(path_exists(cg[c]));
    for (int i = 0; i < 3; i++) { /* the loop serves the other sandbox meanwhile */
        sh(b, "echo served", &r);
        assert_string_equal(r.out, "served\n");
        run_free(&r);
    }
    assert_int_equal(done, 0);
    assert_int_equal(kill(td, SIGCONT), 0);
    while (!done)
        assert_true(event_base_loop(base, EVLOOP_ONCE) == 0);
    assert_false(path_exists(dir));
    WAIT_FOR(!loop_backs(dev, ida));
    assert_false(loop_backs(dev, ida));
    f = fopen("/proc/self/mountinfo", "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strstr(line, ida))
            fail_msg("mount left behind: %s", line);
    fclose(f);
    kill_wait(b);
}

/* Formatted disks wait in state_dir/images; a create takes one and the pool refills. */
static void test_disk_pool_refills(void **state)
{
    char dir[128], id[64];
    wk_sandbox *sb;
    int ready = 0;

    snprintf(dir, sizeof(dir), "%s/images", state_dir);
    for (int i = 0; i < 500 && ready < 2; i++) {
        struct dirent *e;
        DIR *d = opendir(dir);
        ready = 0;
        while (d && (e = readdir(d)))
            ready += strstr(e->d_name, ".ready-") != NULL;
        if (d)
            closedir(d);
        if (ready < 2) {
            event_base_loop(base, EVLOOP_NONBLOCK);
            usleep(10000);
        }
    }
    assert_int_equal(ready, 2);
    sb = create(id, sizeof(id));
    kill_wait(sb);
}

/* wk_rmtree: trees deeper than PATH_MAX go; a file system mounted inside is not
 * entered. */
static void test_rmtree_depth_and_mounts(void **state)
{
    char root[128], p[WK_PATH_MAX];
    int fd;

    snprintf(root, sizeof(root), "%s/rmtree", state_dir);
    assert_int_equal(mkdir(root, 0700), 0);
    fd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(fd >= 0);
    for (int i = 0; i < 3000; i++) { /* 3000 levels x 3 bytes > PATH_MAX */
        int next;
        assert_int_equal(mkdirat(fd, "dd", 0700), 0);
        next = openat(fd, "dd", O_RDONLY | O_DIRECTORY);
        assert_true(next >= 0);
        close(fd);
        fd = next;
    }
    close(fd);
    assert_int_equal(wk_rmtree(root), 0);
    assert_false(path_exists(root));
    /* a mount inside: not emptied, the removal says so */
    assert_int_equal(mkdir(root, 0700), 0);
    snprintf(p, sizeof(p), "%s/m", root);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(mount("tmpfs", p, "tmpfs", 0, "size=1m"), 0);
    snprintf(p, sizeof(p), "%s/m/keep", root);
    fd = open(p, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    {
        int rc = wk_rmtree(root); /* EBUSY (the mount point) or EXDEV */
        assert_true(rc == -EBUSY || rc == -EXDEV);
    }
    assert_true(path_exists(p));
    snprintf(p, sizeof(p), "%s/m", root);
    assert_int_equal(umount2(p, MNT_DETACH), 0);
    assert_int_equal(wk_rmtree(root), 0);
}

static void test_create_times(void **state)
{
    double total = 0, worst = 0;
    enum { N = 10 };

    for (int i = 0; i < N; i++) {
        char id[64];
        uint64_t t0 = sf_mono_us();
        wk_sandbox *sb = create(id, sizeof(id));
        double ms = (double)(sf_mono_us() - t0) / 1000.0;
        total += ms;
        worst = ms > worst ? ms : worst;
        t0 = sf_mono_us();
        kill_wait(sb);
        printf("#   kill: %.2f ms\n", (double)(sf_mono_us() - t0) / 1000.0);
    }
    printf("# create over %d runs: mean %.2f ms, worst %.2f ms\n", N, total / N, worst);
}

/* A worker that dies without killing its sandboxes (issue 26): the next start (host_init on
 * the same state_dir) leaves the living ones; one is taken back (adopt: its agent answers
 * the new worker, its files are there), the other, of which the worker has no record, is
 * removed with everything it left (adopt_end). */
static void test_host_cleanup_after_a_worker_crash(void **state)
{
    struct {
        char id[2][64];
        char dir[2][WK_PATH_MAX];
        char cg[2][WK_CG_N][320];
    } left;
    char dir2[sizeof(state_dir) + 16];
    wk_host_cfg c2 = hcfg;
    size_t got = 0;
    pid_t child;
    int status, p[2], paused = -1, done = 0;
    const char *why;
    wk_driver *d2;
    wk_sandbox *sb = NULL;
    run r;

    snprintf(dir2, sizeof(dir2), "%s/crash", state_dir);
    assert_int_equal(mkdir(dir2, 0700), 0);
    c2.state_dir = dir2;
    assert_int_equal(pipe(p), 0);
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        char w[512];
        base = event_base_new();
        c2.base = base;
        c2.pool = wk_pool_new(base, 1);
        if (!c2.pool || ops->host_init(&c2, &d2, &why) < 0)
            _exit(1);
        memset(&left, 0, sizeof(left));
        for (int i = 0; i < 2; i++) {
            run rr;
            snprintf(left.id[i], sizeof(left.id[i]), "crash%d-%d", (int)getpid(), i);
            if (try_create(d2, left.id[i], NULL, &sb, w, sizeof(w)) < 0)
                _exit(1);
            exec_full(sb, "echo kept > /root/mark", NULL, NULL, 20000, &rr);
            if (rr.error || rr.exit_code != 0)
                _exit(3);
            memcpy(left.dir[i], sb->sbdir, sizeof(left.dir[i]));
            memcpy(left.cg[i], sb->cg.dir, sizeof(left.cg[i]));
        }
        if (write(p[1], &left, sizeof(left)) != (ssize_t)sizeof(left))
            _exit(2);
        _exit(0); /* dies without a kill: its jails and its lxcfs run on */
    }
    close(p[1]);
    while (got < sizeof(left)) {
        ssize_t n = read(p[0], (char *)&left + got, sizeof(left) - got);
        assert_true(n > 0);
        got += (size_t)n;
    }
    close(p[0]);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(ops->host_init(&c2, &d2, &why), 0);
    assert_true(path_exists(left.dir[0]) && path_exists(left.dir[1]));
    assert_int_equal(ops->adopt(d2, left.id[0], &sb, &paused, &why), 0);
    assert_int_equal(paused, 0);
    sh(sb, "cat /root/mark", &r);
    assert_string_equal(r.out, "kept\n");
    run_free(&r);
    assert_int_equal(ops->adopt(d2, left.id[0], &sb, &paused, &why), -EEXIST);
    ops->adopt_end(d2); /* the other: no record of it */
    assert_false(path_exists(left.dir[1]));
    for (int c = 0; c < WK_CG_N; c++)
        if (left.cg[1][c][0])
            assert_false(path_exists(left.cg[1][c]));
    assert_true(path_exists(left.dir[0]));
    ops->kill(sb, on_killed, &done);
    while (!done)
        assert_true(event_base_loop(base, EVLOOP_ONCE) == 0);
    assert_false(path_exists(left.dir[0]));
    ops->host_fini(d2);
    /* the orphaned jail inits came to us (subreaper): reap them */
    while (waitpid(-1, &status, WNOHANG) > 0)
        ;
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_streams_and_exit_code),
        cmocka_unit_test(test_one_mebibyte_is_truncated),
        cmocka_unit_test(test_timeout_kills_the_process_group),
        cmocka_unit_test(test_sees_only_its_own_processes),
        cmocka_unit_test(test_host_files_are_invisible),
        cmocka_unit_test(test_proc_shows_the_sandbox),
        cmocka_unit_test(test_template_is_read_only_but_tmp_and_root_are_writable),
        cmocka_unit_test(test_network_has_only_lo),
        cmocka_unit_test(test_seccomp_no_new_privs_and_caps),
        cmocka_unit_test(test_cgroup_limits),
        cmocka_unit_test(test_shm_fill_is_stopped_by_the_box),
        cmocka_unit_test(test_long_command),
        cmocka_unit_test(test_nofile_and_shm),
#ifdef SF_PROBE_PATH
        cmocka_unit_test(test_socket_families),
#endif
        cmocka_unit_test(test_fork_bomb_is_contained),
        cmocka_unit_test(test_sandboxes_are_isolated_from_each_other),
        cmocka_unit_test(test_concurrent_execs),
        cmocka_unit_test(test_exec_limit_per_sandbox),
        cmocka_unit_test(test_unanswered_exec_and_kill_of_a_frozen_sandbox),
        cmocka_unit_test(test_cwd_and_env),
        cmocka_unit_test(test_bad_requests_are_refused),
        cmocka_unit_test(test_agent_death_fails_pending_and_later_execs),
        cmocka_unit_test(test_kill_fails_pending_execs),
        cmocka_unit_test(test_kill_from_inside_a_callback),
        cmocka_unit_test(test_kill_leaves_nothing_behind),
        cmocka_unit_test(test_disk_and_inode_quota),
        cmocka_unit_test(test_teardown_in_a_child_can_be_stopped),
        cmocka_unit_test(test_disk_pool_refills),
        cmocka_unit_test(test_rmtree_depth_and_mounts),
        cmocka_unit_test(test_create_times),
        cmocka_unit_test(test_host_cleanup_after_a_worker_crash),
    };

    if (geteuid() != 0) {
        printf("# jail integration tests need root: skipped\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IONBF, 0);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
