/* The qemu driver's operations (driver.h, `wk_qemu_driver`): host set-up (the
 * guest and the template snapshot, see qemu_template.c), resources, and the
 * per-sandbox operations of qemu_vm.c. Paused VMs go to disk after save_after_ms,
 * or sooner while the host's available memory is low. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "adopt.h"
#include "qemu.h"
#include "qemu_int.h"
#include "safefs.h"
#include "sf_log.h"
#include "sf_util.h"
#include "template.h"
#include "sf_msg.h"


#define QEMU_BIN "/usr/bin/qemu-system-x86_64"
#define QEMU_IMG "/usr/bin/qemu-img"
#define CREATE_TIMEOUT_MS 60000
#define MOVE_TIMEOUT_MS 120000 /* pause, resume, save to disk, load: seconds at most */
#define FINI_WAIT_MS 20000
#define PRESSURE_TICK_MS 2000

static int copy_str(char *dst, size_t n, const char *src)
{
    size_t len = src ? strlen(src) : 0;
    if (len >= n)
        return -ENAMETOOLONG;
    memcpy(dst, src ? src : "", len + 1);
    return 0;
}

/* Hardware virtualization: the CPU flag, and /dev/kvm usable. (These build hosts
 * have a /dev/kvm without vmx/svm whose guests crash: TCG there.) */
static int kvm_usable(void)
{
    char line[8192];
    int flag = 0, fd;
    FILE *f = fopen("/proc/cpuinfo", "re");

    while (f && !flag && fgets(line, sizeof(line), f))
        if (!strncmp(line, "flags", 5) && (strstr(line, " vmx") || strstr(line, " svm")))
            flag = 1;
    if (f)
        fclose(f);
    if (!flag || (fd = open("/dev/kvm", O_RDWR | O_CLOEXEC)) < 0)
        return 0;
    close(fd);
    return 1;
}

/* The host's TSC rate (kHz, rounded to a MHz so it is stable between runs): a TCG
 * guest's TSC runs at it, and the guest must not calibrate (see the kernel line). */
static uint32_t tsc_khz(void)
{
    struct timespec a, b, nap = {0, 100 * 1000 * 1000};
    uint64_t t0, t1, ns;

    clock_gettime(CLOCK_MONOTONIC_RAW, &a);
    t0 = __rdtsc();
    nanosleep(&nap, NULL);
    t1 = __rdtsc();
    clock_gettime(CLOCK_MONOTONIC_RAW, &b);
    ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)(b.tv_nsec - a.tv_nsec);
    if (!ns)
        return 0;
    return (uint32_t)(((t1 - t0) * 1000000u / ns + 500) / 1000 * 1000);
}

/* What the host offers VMs (the daemon measured it: cfg->host), and the caps of the
 * worker's parent cgroups (every QEMU of this worker runs under them: the platform's
 * daemons keep their reserve). */
static void host_offer(const wk_host_cfg *c, wk_driver *d, wk_cg_caps *caps)
{
    d->res.mem_mib = c->host.mem_mib;
    caps->mem_bytes = d->res.mem_mib << 20;
    caps->tcp_bytes = caps->mem_bytes / WK_TCP_SHARE; /* v1: QEMU opens no TCP socket */
    caps->vcpu_milli = c->host.vcpu_cap_milli < 10 ? 10 : c->host.vcpu_cap_milli;
    d->res.vcpu_milli = c->host.vcpu_milli;
    d->res.disk_mib = c->host.disk_mib;
    /* Each VM also costs QEMU's own memory: count it in the slots, and the pool's VMs
     * are not the sandboxes' to use. */
    {
        uint64_t vm = d->defaults.memory_mib + WK_QEMU_OVERHEAD_MIB, pool = d->pool_target * vm;
        d->res.mem_mib = d->res.mem_mib > pool ? d->res.mem_mib - pool : 0;
        d->res.slots = (uint32_t)(d->res.mem_mib / vm);
    }
    if (d->res.slots == 0)
        d->res.slots = 1;
}

/* 1 when folder name under sb_dir is one of d's VMs (taken back, or this run's pool). */
static int dir_in_use(const wk_driver *d, const char *name)
{
    for (wk_sandbox *sb = d->vms; sb; sb = wk_qvm_next(sb)) {
        const char *dir = wk_qvm_dir(sb), *base = dir ? strrchr(dir, '/') : NULL;
        if (base && !strcmp(base + 1, name))
            return 1;
    }
    return 0;
}

/* What an earlier run left under sb_dir: its VMs outlive it (docs/internals/restart.md).
 * At host_init (!at_end) the folders of the VMs a live handle names stay for adopt
 * (d->keep_dirs); at adopt_end those this run did not take back go too, with their
 * handles. A folder that goes takes its cgroup along (what still runs there is killed:
 * pool VMs, creates cut short, VMs nobody took back). */
static void host_cleanup(wk_driver *d, int at_end)
{
    struct dirent *e;
    DIR *dir;
    int root;

    if (!at_end && (d->keep_dirs = json_object()) &&
        (root = wk_adopt_root(d->state_dir, 0)) >= 0 && (dir = fdopendir(root))) {
        while ((e = readdir(dir))) {
            char name[64];
            const char *why;
            if (sf_id_valid(e->d_name) &&
                wk_qvm_handle_check(d, e->d_name, name, sizeof(name), &why) == 0)
                json_object_set_new(d->keep_dirs, name, json_string(e->d_name));
        }
        closedir(dir);
    }
    if (at_end && (root = wk_adopt_root(d->state_dir, 0)) >= 0 && (dir = fdopendir(root))) {
        while ((e = readdir(dir))) {
            int mine = 0;
            if (!sf_id_valid(e->d_name))
                continue;
            for (wk_sandbox *sb = d->vms; sb && !mine; sb = wk_qvm_next(sb))
                mine = !strcmp(wk_qvm_id(sb), e->d_name);
            if (!mine)
                wk_qvm_handle_remove(d, e->d_name);
        }
        closedir(dir);
    }
    dir = opendir(d->cfg.sb_dir);
    while (dir && (e = readdir(dir))) {
        char path[WK_QEMU_PATH_MAX + 400];
        const char *names[] = {"disk.qcow2", "mem.state", "qemu.log", WK_QEMU_AGENT_SOCK,
                               WK_QEMU_QMP_SOCK};
        wk_cgroup cg;
        int rc;

        if (!sf_id_valid(e->d_name) && strncmp(e->d_name, ".pool-", 6) != 0)
            continue;
        if (at_end ? dir_in_use(d, e->d_name) : json_object_get(d->keep_dirs, e->d_name) != NULL)
            continue;
        wk_cgroup_lookup(&cg, d->host_id, e->d_name[0] == '.' ? e->d_name + 1 : e->d_name);
        if ((rc = wk_cgroup_destroy(&cg)) < 0)
            sf_error("msg=\"cannot remove a leftover VM's cgroup\" dir=%s rc=%d", e->d_name, rc);
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            snprintf(path, sizeof(path), "%s/%.64s/%s", d->cfg.sb_dir, e->d_name, names[i]);
            unlink(path);
        }
        snprintf(path, sizeof(path), "%s/%.64s", d->cfg.sb_dir, e->d_name);
        if (rmdir(path) == 0)
            sf_info("msg=\"removed a leftover sandbox\" sandbox=%s why=\"%s\"", e->d_name,
                    at_end ? "No worker record of it, or it could not be taken back."
                           : "Its VM is gone, or it was never a sandbox (a pool VM, a create "
                             "cut short).");
        else
            sf_error("msg=\"cannot remove a leftover sandbox\" dir=%s errno=%d", path, errno);
    }
    if (dir)
        closedir(dir);
    if (at_end) {
        json_decref(d->keep_dirs);
        d->keep_dirs = NULL;
    }
}

/* Saves the longest-paused VM to disk while available memory is low; marks the template
 * as in use hourly (so no other worker of this host prunes it). */
static void on_pressure_tick(evutil_socket_t fd, short what, void *arg)
{
    wk_driver *d = arg;
    wk_sandbox *oldest = NULL;
    int64_t age = -1;
    uint64_t avail;

    if (sf_mono_ms() - d->touched_ms > 3600 * 1000) {
        wk_qtpl_touch(&d->tpl);
        if (atomic_load(&d->deb_ready))
            wk_qtpl_touch(&d->deb_tpl);
        d->touched_ms = sf_mono_ms();
    }
    if (!d->vms)
        return;
    avail = wk_meminfo_kib("MemAvailable") / 1024;
    if (avail >= d->save_below_mib)
        return;
    for (wk_sandbox *sb = d->vms; sb; sb = wk_qvm_next(sb)) {
        int64_t ms = wk_qvm_paused_ms(sb);
        if (ms > age) {
            age = ms;
            oldest = sb;
        }
    }
    if (oldest && wk_qvm_save(oldest, NULL, NULL) == 0)
        sf_info("msg=\"memory is low: a paused sandbox goes to disk\" sandbox=%s avail_mib=%llu",
                wk_qvm_id(oldest), (unsigned long long)avail);
}

/* worker/vm/build-guest, as the build lays it out: beside sandfleet-worker (vm/), or
 * beside the agent's folder (<build>/worker/agent/../vm/). */
static int find_builder(const char *agent, char *buf, size_t n)
{
    ssize_t len = readlink("/proc/self/exe", buf, n - 32);
    char *slash;

    if (len > 0) {
        buf[len] = '\0';
        if ((slash = strrchr(buf, '/'))) {
            snprintf(slash + 1, 32, "vm/build-guest");
            if (access(buf, X_OK) == 0)
                return 0;
        }
    }
    if (strlen(agent) + 32 > n)
        return -ENAMETOOLONG;
    snprintf(buf, n, "%s", agent);
    if ((slash = strrchr(buf, '/')))
        *slash = '\0';
    if ((slash = strrchr(buf, '/')))
        snprintf(slash + 1, 32, "vm/build-guest");
    return access(buf, X_OK) == 0 ? 0 : -ENOENT;
}

static int qemu_host_init(const wk_host_cfg *c, wk_driver **out, const char **why)
{
    char rootfs[WK_QEMU_PATH_MAX];
    wk_cg_caps caps;
    const char *env;
    wk_driver *d;
    int rc;

    *why = NULL;
    if (!c || !c->base || !c->pool) {
        *why = "The qemu driver needs the worker's event loop and thread pool.";
        return -EINVAL;
    }
    if (!c->state_dir || c->state_dir[0] != '/' || strlen(c->state_dir) > 1024) {
        *why = SF_MSG_STATE_DIR_BAD;
        return -EINVAL;
    }
    if (!c->agent_path || access(c->agent_path, X_OK) < 0) {
        *why = "agent_path must name the built sandfleet-agent binary.";
        return -EINVAL;
    }
    if (c->defaults.memory_mib < 64 || c->defaults.pids_max < 8 || c->defaults.disk_mib < 64) {
        *why = "The qemu driver needs at least 64 MiB of memory, 8 processes and 64 MiB of disk "
               "per sandbox.";
        return -EINVAL;
    }
    if (geteuid() != 0) {
        *why = "The qemu driver needs root (network namespaces, tap devices); run the worker as "
               "root.";
        return -EPERM;
    }
    if (access(QEMU_BIN, X_OK) < 0 || access(QEMU_IMG, X_OK) < 0) {
        *why = "QEMU is not installed; install qemu-system-x86 and qemu-utils.";
        return -ENOENT;
    }
    if (!c->host_id || !sf_id_valid(c->host_id)) {
        *why = SF_MSG_HOST_ID_BAD;
        return -EINVAL;
    }
    if (!(d = calloc(1, sizeof(*d)))) {
        *why = SF_MSG_HOST_NOMEM;
        return -ENOMEM;
    }
    copy_str(d->host_id, sizeof(d->host_id), c->host_id);
    copy_str(d->state_dir, sizeof(d->state_dir), c->state_dir);
    if (copy_str(d->agent, sizeof(d->agent), c->agent_path) < 0) {
        free(d);
        *why = "agent_path is too long.";
        return -ENAMETOOLONG;
    }
    pthread_mutex_init(&d->deb_mu, NULL);
    atomic_init(&d->deb_ready, 0);
    atomic_init(&d->deb_ctl.stop, 0);
    atomic_init(&d->deb_ctl.pid, 0);
    d->base = c->base;
    d->pool = c->pool;
    d->defaults = c->defaults;
    d->create_timeout_ms = CREATE_TIMEOUT_MS;
    d->move_timeout_ms = MOVE_TIMEOUT_MS;
    d->save_after_ms = c->vm_save_after_ms;
    d->pool_target = c->vm_pool;
    copy_str(d->cfg.qemu, sizeof(d->cfg.qemu), QEMU_BIN);
    copy_str(d->cfg.qemu_img, sizeof(d->cfg.qemu_img), QEMU_IMG);
    env = c->vm_dir && c->vm_dir[0] ? c->vm_dir : NULL;
    if ((env ? copy_str(d->cfg.vm_dir, sizeof(d->cfg.vm_dir), env)
             : snprintf(d->cfg.vm_dir, sizeof(d->cfg.vm_dir), "%s/vm", c->state_dir) < 0) < 0 ||
        snprintf(d->cfg.sb_dir, sizeof(d->cfg.sb_dir), "%s/qemu", c->state_dir) < 0 ||
        d->cfg.vm_dir[0] != '/') {
        rc = -EINVAL;
        *why = "vm_dir must be an absolute path.";
        goto fail;
    }
    if ((rc = find_builder(c->agent_path, d->cfg.builder, sizeof(d->cfg.builder))) < 0) {
        *why = "worker/vm/build-guest is not beside sandfleet-worker (in its vm/ folder); "
               "rebuild the worker.";
        goto fail;
    }
    d->cfg.kvm = kvm_usable();
    d->cfg.tsc_khz = d->cfg.kvm ? 0 : tsc_khz();
    if (!d->cfg.kvm && d->cfg.tsc_khz < 100000) {
        rc = -EIO;
        *why = "Cannot measure the host's TSC rate, which a TCG guest needs.";
        goto fail;
    }
    mkdir(c->state_dir, 0700);
    if (mkdir(d->cfg.sb_dir, 0700) < 0 && errno != EEXIST) {
        rc = -errno;
        *why = "Cannot create state_dir/qemu; check that state_dir is writable by root.";
        goto fail;
    }
    if ((rc = wk_cgroup_host_init(d->host_id, NULL, why)) < 0)
        goto fail;
    d->adopting = 1;
    host_cleanup(d, 0);
    if ((rc = wk_template_ensure(c->state_dir, why)) < 0)
        goto fail;
    if (wk_template_path(c->state_dir, rootfs, sizeof(rootfs)) < 0) {
        rc = -ENAMETOOLONG;
        *why = SF_MSG_STATE_DIR_LONG;
        goto fail;
    }
    if ((rc = wk_qtpl_ensure(&d->cfg, rootfs, c->agent_path, d->defaults.memory_mib, 1,
                             d->defaults.pids_max, d->defaults.disk_mib, NULL, NULL, &d->tpl,
                             why)) < 0)
        goto fail;
    host_offer(c, d, &caps);
    if ((rc = wk_cgroup_host_init(d->host_id, &caps, why)) < 0)
        goto fail;
    d->touched_ms = sf_mono_ms();
    d->save_below_mib = (uint32_t)(wk_meminfo_kib("MemTotal") / 1024 / 10);
    if (d->save_below_mib < 512)
        d->save_below_mib = 512;
    {
        struct timeval tick = {PRESSURE_TICK_MS / 1000, 0};
        if (!(d->ev_pressure = event_new(d->base, -1, EV_PERSIST, on_pressure_tick, d)) ||
            event_add(d->ev_pressure, &tick) < 0) {
            rc = -ENOMEM;
            *why = SF_MSG_HOST_NOMEM;
            goto fail;
        }
    }
    if ((rc = wk_qpool_start(d)) < 0) {
        *why = SF_MSG_HOST_NOMEM;
        goto fail;
    }
    sf_info("msg=\"qemu driver ready\" accel=%s template=%s vm_mem_mib=%u slots=%u "
            "save_after_ms=%u pool=%u", d->cfg.kvm ? "kvm" : "tcg", d->tpl.dir,
            d->tpl.memory_mib, d->res.slots, d->save_after_ms, d->pool_target);
    *out = d;
    return 0;
fail:
    if (d->ev_pressure)
        event_free(d->ev_pressure);
    wk_qpool_stop(d);
    json_decref(d->keep_dirs);
    pthread_mutex_destroy(&d->deb_mu);
    free(d);
    return rc;
}

/* ---- 'debian' (driver.h tpl_image) -------------------------------------------- */

/* What names the debian tree's content: its version stamp (etc/sandfleet-template, read
 * inside the tree) and that file's identity (a rebuilt tree has a new one). */
static int deb_tree_key(const char *rootfs, char *buf, size_t n)
{
    int root = wk_sfs_root(rootfs), rc;
    char *v = NULL;
    size_t len = 0;
    struct stat st;

    if (root < 0)
        return root;
    if ((rc = wk_sfs_read_file(root, "etc/sandfleet-template", 64, &v, &len, WK_SFS_AUTO)) < 0 ||
        (rc = wk_sfs_stat(root, "etc/sandfleet-template", &st, WK_SFS_AUTO)) < 0) {
        close(root);
        free(v);
        return rc;
    }
    close(root);
    v[strcspn(v, "\n")] = '\0';
    for (char *p = v; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || *p == '.' || *p == '-'))
            *p = '_';
    rc = snprintf(buf, n, "debian-v%s-%llu.%lld", v, (unsigned long long)st.st_ino,
                  (long long)st.st_mtime);
    free(v);
    return rc < 0 || (size_t)rc >= n ? -ENAMETOOLONG : 0;
}

/* The thread: the guest of the debian tree and its template snapshot (the same shape
 * as base's), minutes under TCG. */
static void *deb_build(void *arg)
{
    wk_driver *d = arg;
    char key[128];
    const char *why = NULL;
    wk_qtpl t;
    int64_t t0 = sf_mono_ms();
    int rc;

    sf_info("msg=\"building the debian guest image and its template snapshot (minutes under "
            "TCG, once per host)\" rootfs=%s", d->deb_rootfs);
    if ((rc = deb_tree_key(d->deb_rootfs, key, sizeof(key))) < 0)
        why = "The 'debian' template's tree has no readable version stamp "
              "(etc/sandfleet-template); remove templates_dir/debian/rootfs to rebuild it.";
    else
        rc = wk_qtpl_ensure(&d->cfg, d->deb_rootfs, d->agent, d->defaults.memory_mib, 1,
                            d->defaults.pids_max, d->defaults.disk_mib, key, &d->deb_ctl, &t,
                            &why);
    pthread_mutex_lock(&d->deb_mu);
    if (rc == 0) {
        d->deb_tpl = t;
        d->deb_state = WK_QDEB_READY;
        atomic_store(&d->deb_ready, 1);
        sf_info("msg=\"template ready\" template=debian driver=qemu dir=%s ms=%lld", t.dir,
                (long long)(sf_mono_ms() - t0));
    } else {
        d->deb_state = WK_QDEB_FAILED;
        d->deb_failed_at = time(NULL);
        d->deb_why = rc == -ECANCELED ? "The worker is stopping."
                     : "The 'debian' guest image could not be built on this host (its reason "
                       "is in the worker log); use 'base', or retry in 10 minutes.";
        sf_error("msg=\"building the debian guest image failed\" rc=%d why=\"%s\"", rc,
                 why ? why : "");
    }
    pthread_mutex_unlock(&d->deb_mu);
    return NULL;
}

static int qemu_tpl_image(wk_driver *d, const char *name, const char *rootfs, const char **why)
{
    int rc;

    *why = NULL;
    if (strcmp(name, "debian") != 0) {
        *why = "This host's qemu driver runs only the 'base' and 'debian' templates.";
        return -ENOTSUP;
    }
    pthread_mutex_lock(&d->deb_mu);
    switch (d->deb_state) {
    case WK_QDEB_READY:
        rc = 1;
        break;
    case WK_QDEB_BUILDING:
        rc = 0;
        break;
    case WK_QDEB_FAILED:
        if (atomic_load(&d->deb_ctl.stop) || time(NULL) - d->deb_failed_at < WK_TPL_RETRY_S) {
            *why = d->deb_why;
            rc = -EIO;
            break;
        }
        __attribute__((fallthrough)); /* tried again */
    default:
        if (copy_str(d->deb_rootfs, sizeof(d->deb_rootfs), rootfs) < 0) {
            *why = "templates_dir is too long; use a shorter path.";
            rc = -ENAMETOOLONG;
            break;
        }
        if (d->deb_th_started)
            pthread_join(d->deb_th, NULL); /* the failed build's thread ended */
        d->deb_th_started = 0;
        d->deb_state = WK_QDEB_BUILDING;
        if (pthread_create(&d->deb_th, NULL, deb_build, d) != 0) {
            d->deb_state = WK_QDEB_FAILED;
            d->deb_failed_at = time(NULL);
            d->deb_why = *why = "The worker cannot start a thread; check its limits.";
            rc = -EAGAIN;
            break;
        }
        d->deb_th_started = 1;
        rc = 0;
    }
    pthread_mutex_unlock(&d->deb_mu);
    return rc;
}

/* Stops a debian build under way (its builder's process group, its QEMU) and waits. */
static void deb_stop(wk_driver *d)
{
    int pid;

    pthread_mutex_lock(&d->deb_mu);
    atomic_store(&d->deb_ctl.stop, 1);
    if ((pid = atomic_load(&d->deb_ctl.pid)) > 0)
        kill(-pid, SIGTERM);
    pthread_mutex_unlock(&d->deb_mu);
    if (d->deb_th_started)
        pthread_join(d->deb_th, NULL);
    d->deb_th_started = 0;
}

static void qemu_host_res(const wk_driver *d, wk_host_res *res)
{
    *res = d->res;
}

static void on_fini_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void qemu_host_fini(wk_driver *d)
{
    struct timeval tick = {0, 50 * 1000};
    int64_t deadline = sf_mono_ms() + FINI_WAIT_MS;
    struct event *ev;

    if (!d)
        return;
    deb_stop(d);
    if (d->ev_pressure)
        event_free(d->ev_pressure);
    d->ev_pressure = NULL;
    wk_qpool_stop(d);
    for (wk_sandbox *sb = d->vms, *next; sb; sb = next) {
        next = wk_qvm_next(sb);
        if (wk_qvm_kept(sb))
            wk_qvm_forget(sb); /* runs on for the next worker */
        else
            wk_qvm_kill(sb, NULL, NULL);
    }
    ev = event_new(d->base, -1, EV_PERSIST, on_fini_tick, NULL);
    if (ev)
        event_add(ev, &tick);
    while (d->n_vms > 0 && sf_mono_ms() < deadline && ev)
        event_base_loop(d->base, EVLOOP_ONCE);
    if (ev)
        event_free(ev);
    if (d->n_vms > 0) {
        sf_warn("msg=\"VMs still tearing down at exit; the next start removes them\" count=%d",
                d->n_vms);
        return; /* d stays allocated: their late callbacks still reach it */
    }
    json_decref(d->keep_dirs);
    pthread_mutex_destroy(&d->deb_mu);
    free(d);
}

static int qemu_create(wk_driver *d, const wk_create_req *req, wk_create_cb cb, void *arg)
{
    wk_create_req r = *req;

    if (!req->id || !sf_id_valid(req->id) || !cb)
        return -EINVAL;
    if (req->build_from) /* no team templates (README: Templates) */
        return -ENOTSUP;
    if (req->layers && (!req->template || strcmp(req->template, "debian") != 0))
        return -ENOTSUP; /* 'base' and 'debian' only: a guest image each */
    if (req->layers && !atomic_load(&d->deb_ready))
        return -EAGAIN; /* (the worker asked tpl_image first) */
    if (!r.limits.memory_mib)
        r.limits.memory_mib = d->defaults.memory_mib;
    if (!r.limits.vcpu_milli)
        r.limits.vcpu_milli = d->defaults.vcpu_milli;
    if (!r.limits.pids_max)
        r.limits.pids_max = d->defaults.pids_max;
    if (!r.limits.disk_mib)
        r.limits.disk_mib = d->defaults.disk_mib;
    if (!r.limits.inodes)
        r.limits.inodes = d->defaults.inodes;
    /* The VM's size is its template's: memory up to it is enforced inside the guest
     * (its cgroup), the disk is the template's, one vCPU is at most one core. */
    if (r.limits.memory_mib > d->tpl.memory_mib || r.limits.memory_mib < 16 ||
        r.limits.disk_mib > d->tpl.disk_mib || r.limits.pids_max < 8 ||
        r.limits.vcpu_milli > 1000 * d->tpl.vcpus)
        return -EINVAL;
    r.limits.disk_mib = d->tpl.disk_mib;
    return wk_qvm_create(d, &r, cb, arg);
}

static void qemu_limits(const wk_sandbox *sb, wk_limits *out)
{
    wk_qvm_limits(sb, out);
}

static int qemu_netns(const wk_sandbox *sb)
{
    return wk_qvm_netns(sb);
}

/* The netns holds the VM's tap; the guest's loopback is reached through the guest agent's
 * relay on the guest's side of the link (agent/agent_relay.c). */
static int qemu_preview_addr(const wk_sandbox *sb, uint16_t port, struct sockaddr_in *addr,
                             int *relay)
{
    (void)sb;
    (void)port;
    memset(addr, 0, sizeof(*addr));
    addr->sin_family = AF_INET;
    addr->sin_port = htons(WK_PREVIEW_RELAY_PORT);
    addr->sin_addr.s_addr = htonl(WK_QEMU_NET_GUEST);
    *relay = 1;
    return 0;
}

/* ---- a worker restart: the VMs of an earlier run (qemu_vm.c) ------------------- */

static void qemu_adopt_end(wk_driver *d)
{
    if (!d || !d->adopting)
        return;
    host_cleanup(d, 1);
    d->adopting = 0;
}

const wk_driver_ops wk_qemu_driver = {
    .name = "qemu",
    .caps = WK_CAP_SNAP_PROCS | WK_CAP_DEBIAN, /* 'debian' through tpl_image; no team templates */
    .host_init = qemu_host_init,
    .host_res = qemu_host_res,
    .host_fini = qemu_host_fini,
    .create = qemu_create,
    .limits = qemu_limits,
    .exec = wk_qvm_exec,
    .kill = wk_qvm_kill,
    .exec_cancel = wk_qvm_exec_cancel,
    .exec_input = wk_qvm_exec_input,
    .file = wk_qvm_file,
    .pause = wk_qvm_pause,
    .resume = wk_qvm_resume,
    .netns = qemu_netns,
    .snapshot = wk_qvm_snapshot,
    .tpl_image = qemu_tpl_image,
    .preview_addr = qemu_preview_addr,
    .adopt = wk_qvm_adopt,
    .adopt_end = qemu_adopt_end,
    .keep = wk_qvm_keep,
};
