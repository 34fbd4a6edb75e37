/* The jail's cgroup logic against a NAMED FAKE cgroupfs: a plain directory under /tmp
 * stands for /sys/fs/cgroup (wk_cgroup_fake), because this host's cgroup v2 tree has no
 * controllers and the v2 code cannot run for real here. The fake records what the
 * code writes (files are created as written), so the tests check the layout and the
 * limit values, v2 and v1. Kills, freezes and process moves are not simulated. No
 * root needed. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cgroup.c"

static char root[64];

static void put(const char *rel, const char *text)
{
    char p[512];
    FILE *f;

    snprintf(p, sizeof(p), "%s/%s", root, rel);
    assert_non_null(f = fopen(p, "w"));
    fputs(text, f);
    fclose(f);
}

static void dir(const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    assert_int_equal(mkdir(p, 0755), 0);
}

static char *get(const char *rel)
{
    static char buf[256];
    char p[512];
    FILE *f;
    size_t n;

    snprintf(p, sizeof(p), "%s/%s", root, rel);
    if (!(f = fopen(p, "r")))
        fail_msg("%s was not written", rel);
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static int exists(const char *rel)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    return stat(p, &st) == 0;
}

static int setup(void **state)
{
    snprintf(root, sizeof(root), "/tmp/sf-cgfake-XXXXXX");
    assert_non_null(mkdtemp(root));
    return wk_cgroup_fake(root) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    return system(cmd) == 0 ? 0 : -1;
}

static const wk_limits shape = {.memory_mib = 256, .vcpu_milli = 500, .disk_mib = 64,
                                .pids_max = 100, .inodes = 4096};

static void test_v2_layout_and_limits(void **state)
{
    wk_cg_caps caps = {.mem_bytes = 1ull << 30, .vcpu_milli = 1500};
    const char *why = NULL;
    wk_cgroup cg;
    int fds[WK_CG_N], box = -1, oom_fd;

    put("cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
    assert_int_equal(wk_cgroup_host_init("h1", &caps, &why), 0);
    assert_true(wk_cgroup_is_v2());
    assert_false(wk_cgroup_tcp_apart());
    assert_string_equal(get("sandfleet/cgroup.subtree_control"), "+memory +pids +cpu");
    assert_string_equal(get("sandfleet/h1/cgroup.subtree_control"), "+memory +pids +cpu");
    assert_string_equal(get("sandfleet/h1/memory.max"), "1073741824");
    assert_string_equal(get("sandfleet/h1/cpu.max"), "150000 100000");

    assert_int_equal(wk_cgroup_create(&cg, "h1", "sb1", &shape, &why), 0);
    assert_true(cg.v2);
    assert_true(cg.fd >= 0); /* the agent's leaf, for CLONE_INTO_CGROUP */
    assert_string_equal(get("sandfleet/h1/sb1/memory.max"), "268435456");
    assert_string_equal(get("sandfleet/h1/sb1/pids.max"), "100");
    assert_string_equal(get("sandfleet/h1/sb1/cpu.max"), "50000 100000");
    assert_string_equal(get("sandfleet/h1/sb1/cpu.weight"), "50");
    assert_string_equal(get("sandfleet/h1/sb1/cgroup.subtree_control"), "+memory");
    assert_true(exists("sandfleet/h1/sb1/agent"));
    /* the box: the sandbox's memory minus the agent's reserve (256/4 > 32 MiB) */
    assert_string_equal(get("sandfleet/h1/sb1/box/memory.max"), "234881024");
    assert_string_equal(get("sandfleet/h1/sb1/box/memory.swap.max"), "0");
    assert_false(exists("sandfleet/h1/sb1/agent/memory.max")); /* no limit of its own */

    assert_int_equal(wk_cgroup_open_tasks(&cg, fds, &box), 0);
    for (int c = 0; c < WK_CG_N; c++)
        assert_int_equal(fds[c], -1); /* v2: born inside */
    assert_true(box >= 0);
    close(box);
    assert_true(exists("sandfleet/h1/sb1/box/cgroup.procs"));

    put("sandfleet/h1/sb1/box/memory.events", "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n");
    oom_fd = -1;
    assert_int_equal(wk_cgroup_oom_kills(&cg, &oom_fd), 2);
    assert_true(oom_fd >= 0);
    /* the file stays open and is read again from its start */
    put("sandfleet/h1/sb1/box/memory.events", "low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\n");
    assert_int_equal(wk_cgroup_oom_kills(&cg, &oom_fd), 3);
    close(oom_fd);

    assert_int_equal(wk_cgroup_destroy(&cg), 0);
    assert_false(exists("sandfleet/h1/sb1"));
    assert_true(exists("sandfleet/h1"));

    /* after a crash, the next start finds the groups by the sandbox's id */
    assert_int_equal(wk_cgroup_create(&cg, "h1", "sb2", &shape, &why), 0);
    close(cg.fd);
    wk_cgroup_lookup(&cg, "h1", "sb2");
    assert_int_equal(wk_cgroup_destroy(&cg), 0);
    assert_false(exists("sandfleet/h1/sb2"));
}

static void test_v2_small_sandbox_keeps_a_quarter_for_the_agent(void **state)
{
    wk_limits tiny = shape;
    const char *why = NULL;
    wk_cgroup cg;

    tiny.memory_mib = 64;
    tiny.vcpu_milli = 5; /* below the weight's floor */
    put("cgroup.controllers", "cpu memory pids\n");
    assert_int_equal(wk_cgroup_host_init("h2", NULL, &why), 0);
    assert_int_equal(wk_cgroup_create(&cg, "h2", "sb", &tiny, &why), 0);
    assert_string_equal(get("sandfleet/h2/sb/box/memory.max"), "50331648"); /* 48 MiB */
    assert_string_equal(get("sandfleet/h2/sb/cpu.weight"), "1");
    assert_string_equal(get("sandfleet/h2/sb/cpu.max"), "500 100000");
    assert_int_equal(wk_cgroup_destroy(&cg), 0);
}

static void test_v1_layout_and_limits(void **state)
{
    wk_cg_caps caps = {.mem_bytes = 8ull << 30, .tcp_bytes = 1ull << 30, .vcpu_milli = 1500};
    const char *why = NULL;
    wk_cgroup cg;
    int fds[WK_CG_N], box = -1, oom_fd;

    dir("memory");
    dir("pids");
    dir("cpu");
    dir("cpuacct");
    dir("freezer");
    dir("cpuset");
    put("cpuset/cpuset.cpus", "0-3\n");
    put("cpuset/cpuset.mems", "0\n");
    put("memory/memory.kmem.tcp.limit_in_bytes", "9223372036854771712\n");
    assert_int_equal(wk_cgroup_host_init("h1", &caps, &why), 0);
    assert_false(wk_cgroup_is_v2());
    assert_true(wk_cgroup_tcp_apart());
    assert_string_equal(get("memory/sandfleet/h1/memory.limit_in_bytes"), "8589934592");
    assert_string_equal(get("memory/sandfleet/h1/memory.kmem.tcp.limit_in_bytes"), "1073741824");
    assert_string_equal(get("cpu/sandfleet/h1/cpu.cfs_quota_us"), "150000");
    assert_string_equal(get("cpu/sandfleet/h1/cpu.cfs_period_us"), "100000");

    assert_int_equal(wk_cgroup_create(&cg, "h1", "sb1", &shape, &why), 0);
    assert_false(cg.v2);
    assert_string_equal(get("memory/sandfleet/h1/sb1/memory.limit_in_bytes"), "268435456");
    assert_string_equal(get("memory/sandfleet/h1/sb1/box/memory.limit_in_bytes"), "234881024");
    assert_string_equal(get("memory/sandfleet/h1/sb1/memory.kmem.tcp.limit_in_bytes"), "33554432");
    assert_string_equal(get("memory/sandfleet/h1/sb1/box/memory.kmem.tcp.limit_in_bytes"), "33554432");
    assert_string_equal(get("pids/sandfleet/h1/sb1/pids.max"), "100");
    assert_string_equal(get("cpu/sandfleet/h1/sb1/cpu.cfs_quota_us"), "50000");
    assert_string_equal(get("cpu/sandfleet/h1/sb1/cpu.shares"), "512");
    assert_true(exists("cpuacct/sandfleet/h1/sb1"));
    assert_true(exists("freezer/sandfleet/h1/sb1"));
    assert_string_equal(get("cpuset/sandfleet/h1/sb1/cpuset.cpus"), "0-3"); /* the parent's */
    assert_string_equal(get("cpuset/sandfleet/h1/sb1/cpuset.mems"), "0");

    assert_int_equal(wk_cgroup_open_tasks(&cg, fds, &box), 0);
    for (int c = 0; c < WK_CG_N; c++) {
        assert_true(fds[c] >= 0); /* the jail's first process moves itself into each */
        close(fds[c]);
    }
    close(box);
    assert_true(exists("memory/sandfleet/h1/sb1/box/tasks"));

    put("memory/sandfleet/h1/sb1/box/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
    oom_fd = -1;
    assert_int_equal(wk_cgroup_oom_kills(&cg, &oom_fd), 1);
    close(oom_fd);

    assert_int_equal(wk_cgroup_destroy(&cg), 0);
    {
        wk_limits big = shape; /* more CPU than the parent has: clamped (v1 refuses it) */
        big.vcpu_milli = 4000;
        assert_int_equal(wk_cgroup_create(&cg, "h1", "sb1", &big, &why), 0);
        assert_string_equal(get("cpu/sandfleet/h1/sb1/cpu.cfs_quota_us"), "150000");
        assert_string_equal(get("cpu/sandfleet/h1/sb1/cpu.shares"), "4096");
        assert_int_equal(wk_cgroup_destroy(&cg), 0);
    }
    assert_false(exists("memory/sandfleet/h1/sb1"));
    assert_false(exists("cpu/sandfleet/h1/sb1"));
    assert_false(exists("freezer/sandfleet/h1/sb1"));
    assert_false(exists("cpuset/sandfleet/h1/sb1"));
}

static void test_shares_and_limits_helpers(void **state)
{
    assert_int_equal(wk_cpu_shares(1000), 1024);
    assert_int_equal(wk_cpu_shares(1), 2);
    assert_int_equal(wk_cpu_weight(1000), 100);
    assert_int_equal(wk_cpu_weight(2000000), 10000);
    assert_int_equal(wk_agent_reserve(512ull << 20), 32ull << 20);
    assert_int_equal(wk_agent_reserve(64ull << 20), 16ull << 20);
    assert_int_equal(wk_tcp_limit(512ull << 20), 64ull << 20);
    assert_int_equal(wk_tcp_limit(16ull << 20), 4ull << 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_v2_layout_and_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v2_small_sandbox_keeps_a_quarter_for_the_agent,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1_layout_and_limits, setup, teardown),
        cmocka_unit_test(test_shares_and_limits_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
