/* hostres.c: the host's resources under the host policy, measured once by the daemon
 * (driver.h wk_host_measure); drivers take their own costs off what it gives them. */
#include "driver.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

uint64_t wk_meminfo_kib(const char *key)
{
    char line[256];
    size_t klen = strlen(key);
    unsigned long long v = 0;
    FILE *f = fopen("/proc/meminfo", "re");

    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            sscanf(line + klen + 1, "%llu", &v);
            break;
        }
    if (f)
        fclose(f);
    return v;
}

/* Free MiB of the filesystem state_dir is (or will be: host_init makes it) on: its nearest
 * existing folder's. 0 when none answers. */
static uint64_t free_mib(const char *dir)
{
    char p[4096];
    struct statvfs sv;
    char *slash;

    if (!dir || snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
        return 0;
    while (statvfs(p, &sv) < 0) {
        if (errno != ENOENT || !(slash = strrchr(p, '/')) || slash == p)
            return errno == ENOENT && statvfs("/", &sv) == 0
                       ? (uint64_t)sv.f_bavail * sv.f_frsize / (1 << 20)
                       : 0;
        *slash = '\0';
    }
    return (uint64_t)sv.f_bavail * sv.f_frsize / (1 << 20);
}

void wk_host_measure(wk_host_cfg *c)
{
    uint64_t share = c->host_share_pct ? c->host_share_pct : 100;
    uint64_t mem_mib = wk_meminfo_kib("MemTotal") / 1024, cpu;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    mem_mib = mem_mib > c->reserve_mem_mib ? mem_mib - c->reserve_mem_mib : 0;
    c->host.mem_mib = mem_mib * share / 100;
    cpu = (uint64_t)(ncpu > 0 ? ncpu : 1) * 1000;
    cpu = cpu > c->reserve_vcpu_milli + 100 ? cpu - c->reserve_vcpu_milli : 100;
    cpu = cpu * share / 100;
    c->host.vcpu_cap_milli = cpu;
    c->host.vcpu_milli = cpu * (c->cpu_overcommit_pct ? c->cpu_overcommit_pct : 100) / 100;
    c->host.disk_mib = free_mib(c->state_dir) * share / 100 *
                       (c->disk_overcommit_pct ? c->disk_overcommit_pct : 100) / 100;
}
