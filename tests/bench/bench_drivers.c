/* tests/bench/drivers [N]: the jail and qemu drivers side by side, in one run, through
 * their operations tables (driver.h) on one libevent loop, no Kafka or Redis: what each
 * driver costs by itself.
 *
 * Rows: create (jail: clone + agent ping; qemu: restore of the template snapshot until
 * the agent answered, and the CPU that costs; qemu from its pool of VMs restored ahead of
 * time: a ping), exec `true` round trip, and for qemu pause (QMP stop), resume
 * (cont + clock ping), save to disk (stop + migrate + QEMU exits) and resume from disk
 * (new QEMU + load + cont + ping); snapshot (driver.h: jail: freeze, copy its files,
 * thaw; qemu: stop, migrate to a file, copy its disk, cont) and create from a snapshot
 * (jail: its files copied into the new disk; qemu: new QEMU + load + cont + ping);
 * p50/p99 in ms and the ratio to the jail's p50. Then
 * resident memory: per running sandbox (RSS, and what is private to it: the rest is
 * shared, e.g. the template's RAM pages in the page cache), per VM paused in memory (a
 * stopped TCG guest keeps what it held) and per VM saved to disk. Needs root. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "driver.h"
#include "jail.h"
#include "qemu.h"
#include "qemu_int.h"
#include "sf_util.h"

static struct event_base *base;

static void spin_until(const int *flag)
{
    struct timeval tick = {0, 5 * 1000};
    int64_t deadline = sf_mono_ms() + 300000;

    while (!*flag) {
        if (sf_mono_ms() > deadline) {
            fprintf(stderr, "bench: an operation took over 300 s\n");
            exit(1);
        }
        event_base_loopexit(base, &tick);
        event_base_dispatch(base);
    }
}

typedef struct done {
    int done, rc;
    wk_sandbox *sb;
} done;

static void on_created(void *arg, wk_sandbox *sb, int rc, const char *why)
{
    done *d = arg;
    d->done = 1;
    d->rc = rc;
    d->sb = sb;
    if (rc < 0)
        fprintf(stderr, "bench: create failed: %s\n", why ? why : "");
}

static void on_exec(void *arg, const wk_exec_result *res)
{
    done *d = arg;
    d->done = 1;
    d->rc = res->error || res->exit_code ? -1 : 0;
    if (res->error)
        fprintf(stderr, "bench: exec failed: %s\n", res->error);
}

static void on_op(void *arg, int rc, const char *why)
{
    done *d = arg;
    d->done = 1;
    d->rc = rc;
}

static void on_killed(void *arg, int rc)
{
    done *d = arg;
    d->done = 1;
    d->rc = rc;
}

static int seq;

/* A sandbox (from the snapshot in dir, or NULL); ms: its create time. */
static wk_sandbox *create(const wk_driver_ops *ops, wk_driver *drv, const char *dir, double *ms,
                          char *id_out)
{
    char id[64];
    wk_create_req req = {.id = id, .snapshot = dir};
    done d = {0};
    uint64_t t0;

    snprintf(id, sizeof(id), "sb_bench%d_%d", (int)getpid() % 100000, ++seq);
    t0 = sf_mono_us();
    if (ops->create(drv, &req, on_created, &d) < 0)
        exit(1);
    spin_until(&d.done);
    if (ms)
        *ms = (double)(sf_mono_us() - t0) / 1000.0;
    if (d.rc < 0)
        exit(1);
    if (id_out)
        memcpy(id_out, id, strlen(id) + 1);
    return d.sb;
}

static double exec_true(const wk_driver_ops *ops, wk_sandbox *sb)
{
    wk_exec_req req = {.command = "true", .timeout_ms = 60000};
    done d = {0};
    uint64_t t0 = sf_mono_us();

    if (ops->exec(sb, &req, on_exec, &d) < 0)
        exit(1);
    spin_until(&d.done);
    if (d.rc < 0)
        exit(1);
    return (double)(sf_mono_us() - t0) / 1000.0;
}

static double vm_op(int (*fn)(wk_sandbox *, wk_qvm_cb, void *), wk_sandbox *sb)
{
    done d = {0};
    uint64_t t0 = sf_mono_us();

    if (fn(sb, on_op, &d) < 0)
        exit(1);
    spin_until(&d.done);
    if (d.rc < 0)
        exit(1);
    return (double)(sf_mono_us() - t0) / 1000.0;
}

typedef struct snapped {
    int done, rc;
} snapped;

static void on_snapped(void *arg, int rc, uint64_t bytes, const char *why)
{
    snapped *s = arg;
    (void)bytes;
    s->done = 1;
    s->rc = rc;
    if (rc < 0)
        fprintf(stderr, "bench: snapshot failed: %s\n", why ? why : "");
}

static double snapshot(const wk_driver_ops *ops, wk_sandbox *sb, const char *dir)
{
    snapped s = {0};
    uint64_t t0 = sf_mono_us();

    if (ops->snapshot(sb, dir, on_snapped, &s) < 0)
        exit(1);
    spin_until(&s.done);
    if (s.rc < 0)
        exit(1);
    return (double)(sf_mono_us() - t0) / 1000.0;
}

static void wait_pool(wk_driver *d)
{
    struct timeval tick = {0, 5 * 1000};
    while (wk_qpool_ready(d) < 1) {
        event_base_loopexit(base, &tick);
        event_base_dispatch(base);
    }
}

static void kill_wait(const wk_driver_ops *ops, wk_sandbox *sb)
{
    done d = {0};
    ops->kill(sb, on_killed, &d);
    spin_until(&d.done);
}

/* CPU time a process's threads have run (ns, /proc/<pid>/task/<tid>/schedstat): what a
 * restore costs by itself, whatever else the host runs. */
static double cpu_ms(pid_t pid)
{
    char path[128];
    unsigned long long ns, sum = 0;
    struct dirent *e;
    DIR *d;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    if (!(d = opendir(path)))
        return 0;
    while ((e = readdir(d))) {
        FILE *f;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", (int)pid, e->d_name);
        if (!(f = fopen(path, "re")))
            continue;
        if (fscanf(f, "%llu", &ns) == 1)
            sum += ns;
        fclose(f);
    }
    closedir(d);
    return (double)sum / 1e6;
}

/* ---- statistics ------------------------------------------------------------ */

typedef struct row {
    const char *label;
    double *v;
    int n;
} row;

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double q(row *r, double p)
{
    int i = (int)(p * r->n);
    qsort(r->v, (size_t)r->n, sizeof(double), cmp);
    return r->v[i < r->n ? i : r->n - 1];
}

static void print_row(row *r, double base_p50)
{
    double p50 = q(r, 0.5);
    printf("%-46s %5d %9.2f %9.2f %9.2f", r->label, r->n, p50, q(r, 0.99), r->v[r->n - 1]);
    if (base_p50 > 0)
        printf(" %9.1fx", p50 / base_p50);
    printf("\n");
}

/* ---- memory ------------------------------------------------------------------ */

/* RSS and private (Private_Clean + Private_Dirty) of one process, in KiB. */
static void mem_of(pid_t pid, long *rss, long *priv)
{
    char path[64], line[256];
    long v, pc = 0, pd = 0;
    FILE *f;

    *rss = *priv = 0;
    snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
    if (!(f = fopen(path, "re")))
        return;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "Rss: %ld kB", &v) == 1)
            *rss = v;
        else if (sscanf(line, "Private_Clean: %ld kB", &v) == 1)
            pc = v;
        else if (sscanf(line, "Private_Dirty: %ld kB", &v) == 1)
            pd = v;
    }
    fclose(f);
    *priv = pc + pd;
}

/* Processes whose cgroup path names the jail sandbox id (its agent and children). */
static void jail_mem(const char *id, long *rss, long *priv)
{
    struct dirent *e;
    DIR *d = opendir("/proc");
    char path[64], buf[4096], want[80];

    *rss = *priv = 0;
    snprintf(want, sizeof(want), "/%.64s", id);
    while (d && (e = readdir(d))) {
        int fd;
        ssize_t n;
        long r, p;

        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%.16s/cgroup", e->d_name);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        if (!strstr(buf, want))
            continue;
        mem_of((pid_t)atoi(e->d_name), &r, &p);
        *rss += r;
        *priv += p;
    }
    if (d)
        closedir(d);
}

/* ---- host set-up --------------------------------------------------------------- */

static wk_driver *host(const wk_driver_ops *ops, wk_pool *pool, const char *state_dir)
{
    const char *why = NULL, *vm_dir = getenv("SF_VM_DIR");
    wk_driver *drv = NULL;
    wk_host_cfg hc = {.base = base, .pool = pool, .host_id = "bench", .state_dir = state_dir,
                      .agent_path = SF_AGENT_PATH,
                      .defaults = {.memory_mib = 512, .vcpu_milli = 1000, .disk_mib = 2048,
                                   .pids_max = 256, .inodes = 262144},
                      .host_share_pct = 100, .reserve_mem_mib = 1024, .reserve_vcpu_milli = 500,
                      .cpu_overcommit_pct = 1000, .nofile = 4096, .uid_base = 3000000,
                      .pool_images = 4, .vm_dir = vm_dir ? vm_dir : "/var/cache/sandfleet/vm",
                      .vm_save_after_ms = 0, .vm_pool = 0};

    mkdir(state_dir, 0700);
    wk_host_measure(&hc); /* as the daemon does */
    if (ops->host_init(&hc, &drv, &why) < 0) {
        fprintf(stderr, "bench: %s host_init failed: %s\n", ops->name, why ? why : "");
        exit(1);
    }
    return drv;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 30;
    const wk_driver_ops *J = &wk_jail_driver, *Q = &wk_qemu_driver;
    char jdir[128], qdir[128];
    wk_driver *jd, *qd;
    wk_pool *pool;
    row r[15];
    double *v;
    int nv = 2 * (n < 5 ? 5 : n);

    if (geteuid() != 0) {
        fprintf(stderr, "bench: needs root\n");
        return 77;
    }
    if (n < 5)
        n = 5;
    signal(SIGPIPE, SIG_IGN);
    snprintf(jdir, sizeof(jdir), "/tmp/sf-bench-jail-%d", (int)getpid());
    snprintf(qdir, sizeof(qdir), "/tmp/sf-bench-qemu-%d", (int)getpid());
    base = event_base_new();
    pool = wk_pool_new(base, 2);
    jd = host(J, pool, jdir);
    qd = host(Q, pool, qdir);
    v = calloc((size_t)nv * 15, sizeof(double));
    for (int i = 0; i < 15; i++)
        r[i] = (row){NULL, v + (size_t)i * nv, 0};
    r[0].label = "jail: create (clone + agent ping)";
    r[1].label = "qemu: create (snapshot restore + agent ping)";
    r[2].label = "jail: exec true (round trip)";
    r[3].label = "qemu: exec true (round trip)";
    r[4].label = "qemu: pause (QMP stop)";
    r[5].label = "qemu: resume (cont + clock ping)";
    r[6].label = "qemu: save to disk (stop, migrate, QEMU exits)";
    r[7].label = "qemu: resume from disk (new QEMU, load, ping)";
    r[8].label = "qemu: create, CPU time of its QEMU (load-free)";
    r[9].label = "qemu: create from the pool (ping a restored VM)";
    r[11].label = "jail: snapshot (freeze, copy its files, thaw)";
    r[12].label = "qemu: snapshot (stop, migrate, copy disk, cont)";
    r[13].label = "jail: create from a snapshot";
    r[14].label = "qemu: create from a snapshot (load, cont, ping)";

    /* create (the qemu driver restoring each: no pool), exec on the sandbox just made,
     * then kill (untimed) */
    wk_qpool_set(qd, 0);
    for (int i = 0; i < n; i++) {
        wk_sandbox *j, *q;
        double ms;

        j = create(J, jd, NULL, &ms, NULL);
        r[0].v[r[0].n++] = ms;
        q = create(Q, qd, NULL, &ms, NULL);
        r[1].v[r[1].n++] = ms;
        r[8].v[r[8].n++] = cpu_ms(wk_qvm_pid(q));
        for (int k = 0; k < 5; k++) {
            r[2].v[r[2].n++ % nv] = exec_true(J, j);
            r[3].v[r[3].n++ % nv] = exec_true(Q, q);
        }
        kill_wait(J, j);
        kill_wait(Q, q);
    }
    /* create from the pool: each time a VM waits in it (the refill untimed) */
    wk_qpool_set(qd, 1);
    for (int i = 0; i < n; i++) {
        wk_sandbox *q;
        double ms;
        wait_pool(qd);
        q = create(Q, qd, NULL, &ms, NULL);
        r[9].v[r[9].n++] = ms;
        kill_wait(Q, q);
    }
    wk_qpool_set(qd, 0);
    if (r[2].n > nv)
        r[2].n = nv;
    if (r[3].n > nv)
        r[3].n = nv;
    /* pause/resume and save/load cycles on one VM (exec between: it must answer) */
    {
        wk_sandbox *q = create(Q, qd, NULL, NULL, NULL);
        for (int i = 0; i < n; i++) {
            r[4].v[r[4].n++] = vm_op(wk_qvm_pause, q);
            r[5].v[r[5].n++] = vm_op(wk_qvm_resume, q);
            exec_true(Q, q);
            r[6].v[r[6].n++] = vm_op(wk_qvm_save, q);
            r[7].v[r[7].n++] = vm_op(wk_qvm_resume, q);
            exec_true(Q, q);
        }
        kill_wait(Q, q);
    }
    /* snapshot of a running sandbox (a file written, a process running), then a create
     * from it; the snapshot's files go after each round (untimed) */
    {
        wk_sandbox *j = create(J, jd, NULL, NULL, NULL), *q = create(Q, qd, NULL, NULL, NULL);
        wk_exec_req req = {.command = "echo kept > /root/f; sleep 100000 >/dev/null 2>&1 &",
                           .timeout_ms = 60000};
        done d1 = {0}, d2 = {0};
        if (J->exec(j, &req, on_exec, &d1) < 0 || Q->exec(q, &req, on_exec, &d2) < 0)
            exit(1);
        spin_until(&d1.done);
        spin_until(&d2.done);
        for (int i = 0; i < n; i++) {
            char jsnap[200], qsnap[200], cmd[500];
            wk_sandbox *x;
            double ms;
            snprintf(jsnap, sizeof(jsnap), "%s/snap-%d", jdir, i);
            snprintf(qsnap, sizeof(qsnap), "%s/snap-%d", qdir, i);
            r[11].v[r[11].n++] = snapshot(J, j, jsnap);
            r[12].v[r[12].n++] = snapshot(Q, q, qsnap);
            x = create(J, jd, jsnap, &ms, NULL);
            r[13].v[r[13].n++] = ms;
            exec_true(J, x);
            kill_wait(J, x);
            x = create(Q, qd, qsnap, &ms, NULL);
            r[14].v[r[14].n++] = ms;
            exec_true(Q, x);
            kill_wait(Q, x);
            snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", jsnap, qsnap);
            if (system(cmd) != 0)
                exit(1);
        }
        kill_wait(J, j);
        kill_wait(Q, q);
    }

    printf("\nsandfleet drivers benchmark: jail vs qemu (accel %s), %d samples per row, one "
           "loop, no Kafka/Redis\n", qd->cfg.kvm ? "kvm" : "tcg", n);
    printf("%-46s %5s %9s %9s %9s %10s\n", "operation", "n", "p50 ms", "p99 ms", "max ms",
           "p50/jail");
    print_row(&r[0], 0);
    print_row(&r[1], q(&r[0], 0.5));
    print_row(&r[9], q(&r[0], 0.5));
    print_row(&r[2], 0);
    print_row(&r[3], q(&r[2], 0.5));
    for (int i = 4; i < 9; i++)
        print_row(&r[i], 0);
    print_row(&r[11], 0);
    print_row(&r[12], q(&r[11], 0.5));
    print_row(&r[13], q(&r[0], 0.5));
    print_row(&r[14], q(&r[0], 0.5));
    {
        double load[3] = {0};
        if (getloadavg(load, 3) == 3)
            printf("(host load average during the run: %.1f %.1f %.1f on %ld CPUs)\n", load[0],
                   load[1], load[2], sysconf(_SC_NPROCESSORS_ONLN));
    }

    /* resident memory: 4 idle sandboxes of each, after a command ran in each */
    {
        enum { M = 4 };
        wk_sandbox *js[M], *qs[M];
        char jid[M][64];
        long rss, priv, jr = 0, jp = 0, qr = 0, qp = 0, pr = 0, pp = 0, sr = 0;
        for (int i = 0; i < M; i++) {
            js[i] = create(J, jd, NULL, NULL, jid[i]);
            qs[i] = create(Q, qd, NULL, NULL, NULL);
            exec_true(J, js[i]);
            exec_true(Q, qs[i]);
        }
        for (int i = 0; i < M; i++) {
            jail_mem(jid[i], &rss, &priv);
            jr += rss;
            jp += priv;
            mem_of(wk_qvm_pid(qs[i]), &rss, &priv);
            qr += rss;
            qp += priv;
        }
        for (int i = 0; i < M; i++)
            vm_op(wk_qvm_pause, qs[i]);
        for (int i = 0; i < M; i++) {
            mem_of(wk_qvm_pid(qs[i]), &rss, &priv);
            pr += rss;
            pp += priv;
        }
        for (int i = 0; i < M; i++) {
            vm_op(wk_qvm_save, qs[i]);
            if (wk_qvm_pid(qs[i]) > 0) {
                mem_of(wk_qvm_pid(qs[i]), &rss, &priv);
                sr += rss;
            }
        }
        printf("\n%-46s %12s %14s\n", "resident memory per sandbox (mean of 4)", "RSS MiB",
               "private MiB");
        printf("%-46s %12.1f %14.1f\n", "jail: running, idle (agent)", jr / 1024.0 / M,
               jp / 1024.0 / M);
        printf("%-46s %12.1f %14.1f\n", "qemu: running, idle (QEMU process)", qr / 1024.0 / M,
               qp / 1024.0 / M);
        printf("%-46s %12.1f %14.1f\n", "qemu: paused in memory (stopped TCG guest)",
               pr / 1024.0 / M, pp / 1024.0 / M);
        printf("%-46s %12.1f %14s\n", "qemu: paused, saved to disk (no process)", sr / 1024.0 / M,
               "0.0");
        for (int i = 0; i < M; i++) {
            kill_wait(J, js[i]);
            kill_wait(Q, qs[i]);
        }
    }
    printf("\ntargets: qemu restore p50 <= 300 ms under TCG (<= 150 ms under KVM); a VM paused "
           "to disk <= 30 MiB resident\n");
    J->host_fini(jd);
    Q->host_fini(qd);
    wk_pool_free(pool);
    event_base_free(base);
    free(v);
    {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", jdir, qdir);
        if (system(cmd) != 0)
            return 1;
    }
    return 0;
}
