/* worker/driver/hostres.c: the host's resources under the host policy (wk_host_measure):
 * each share and overcommit applied to what this machine really has. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "driver.h"

#include <sys/statvfs.h>
#include <unistd.h>

static uint64_t free_mib_tmp(void)
{
    struct statvfs sv;

    assert_int_equal(statvfs("/tmp", &sv), 0);
    return (uint64_t)sv.f_bavail * sv.f_frsize / (1 << 20);
}

/* a within 1% (and 64 MiB) of b: the disk's free space moves while the test runs */
static void assert_near(uint64_t a, uint64_t b)
{
    uint64_t d = a > b ? a - b : b - a;

    assert_true(d <= b / 100 + 64);
}

static void shares_and_overcommit(void **state)
{
    wk_host_cfg c = {.state_dir = "/tmp/sf-hostres-not-made-yet/state", .host_share_pct = 50,
                     .reserve_vcpu_milli = 0, .cpu_overcommit_pct = 200};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    (void)state;
    wk_host_measure(&c);
    /* the nearest existing folder's filesystem, halved; no disk overcommit by default */
    assert_near(c.host.disk_mib, free_mib_tmp() / 2);
    assert_int_equal(c.host.vcpu_cap_milli, (uint64_t)ncpu * 1000 / 2);
    assert_int_equal(c.host.vcpu_milli, (uint64_t)ncpu * 1000 / 2 * 2);
    assert_true(c.host.mem_mib > 0);

    c.disk_overcommit_pct = 1000; /* sparse disks: ten times the free disk may be promised */
    wk_host_measure(&c);
    assert_near(c.host.disk_mib, free_mib_tmp() / 2 * 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(shares_and_overcommit)};

    return cmocka_run_group_tests(tests, NULL, NULL);
}
