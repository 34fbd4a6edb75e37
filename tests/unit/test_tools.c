/* The tool catalogue (common/sf_tools.c): the x-sandfleet declarations of the real schema
 * files, how long a caller waits, claim-check arguments, the handler checks the daemons run
 * at start-up, and declarations that must be refused with a reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sf_tools.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static sf_toolset real;

static int load_real(void **state)
{
    char why[512] = "";
    int rc = sf_toolset_load(&real, SF_SCHEMAS_DIR, why, sizeof(why));
    if (rc < 0)
        fprintf(stderr, "%s\n", why);
    return rc;
}

static int free_real(void **state)
{
    sf_toolset_fini(&real);
    return 0;
}

static void real_declarations(void **state)
{
    const sf_tool *t;

    assert_non_null(t = sf_toolset_find(&real, "sandbox_create"));
    assert_int_equal(t->runs, SF_RUNS_SCHEDULER);
    assert_int_equal(t->sandbox, SF_SB_NEW);
    assert_non_null(t = sf_toolset_find(&real, "sandbox_list"));
    assert_int_equal(t->runs, SF_RUNS_SCHEDULER);
    assert_int_equal(t->sandbox, SF_SB_NONE);
    assert_non_null(t = sf_toolset_find(&real, "sandbox_exec"));
    assert_int_equal(t->runs, SF_RUNS_WORKER);
    assert_int_equal(t->sandbox, SF_SB_EXISTING);
    assert_true(t->resume);
    assert_false(t->internal);
    assert_non_null(json_object_get(json_object_get(t->output, "properties"), "exit_code"));
    /* every tool promises an object; none is internal but sf.cancel, sf.template_build,
     * sf.template_delete and the hosted MCP servers' sf.hosted_start / _send / _listen */
    for (size_t i = 0; i < real.n; i++) {
        assert_string_equal(json_string_value(json_object_get(real.tools[i].output, "type")),
                            "object");
        assert_int_equal(real.tools[i].internal,
                         !strcmp(real.tools[i].name, SF_TOOL_CANCEL) ||
                             !strcmp(real.tools[i].name, SF_TOOL_TEMPLATE_BUILD) ||
                             !strcmp(real.tools[i].name, SF_TOOL_TEMPLATE_DELETE) ||
                             !strcmp(real.tools[i].name, SF_TOOL_HOSTED_START) ||
                             !strcmp(real.tools[i].name, SF_TOOL_HOSTED_SEND) ||
                             !strcmp(real.tools[i].name, SF_TOOL_HOSTED_LISTEN));
    }
    for (size_t i = 0; i < 3; i++) { /* the gateway's own jobs on a session's sandbox */
        const char *n[] = {SF_TOOL_HOSTED_START, SF_TOOL_HOSTED_SEND, SF_TOOL_HOSTED_LISTEN};
        assert_non_null(t = sf_toolset_find(&real, n[i]));
        assert_int_equal(t->runs, SF_RUNS_WORKER);
        assert_int_equal(t->sandbox, SF_SB_EXISTING);
    }
    assert_non_null(t = sf_toolset_find(&real, SF_TOOL_CANCEL));
    assert_int_equal(t->runs, SF_RUNS_WORKER);
    assert_non_null(t = sf_toolset_find(&real, SF_TOOL_TEMPLATE_BUILD));
    assert_int_equal(t->runs, SF_RUNS_WORKER);
    assert_int_equal(t->sandbox, SF_SB_NONE);
    assert_non_null(t = sf_toolset_find(&real, SF_TOOL_TEMPLATE_DELETE));
    assert_int_equal(t->runs, SF_RUNS_WORKER);
    assert_int_equal(t->sandbox, SF_SB_NONE);
    assert_non_null(t = sf_toolset_find(&real, "sandbox_template_delete"));
    assert_int_equal(t->runs, SF_RUNS_SCHEDULER);
    assert_false(t->internal);
}

static void wait_follows_the_declaration(void **state)
{
    const sf_tool *exec = sf_toolset_find(&real, "sandbox_exec");
    const sf_tool *list = sf_toolset_find(&real, "sandbox_list");
    json_t *a = json_pack("{s:i}", "timeout_ms", 1000);

    assert_int_equal(sf_tool_wait_ms(exec, a, 30000, 500), 1500);
    json_object_set_new(a, "timeout_ms", json_integer(10000000));
    assert_int_equal(sf_tool_wait_ms(exec, a, 30000, 500), 600500);
    json_object_set_new(a, "timeout_ms", json_integer(-5));
    assert_int_equal(sf_tool_wait_ms(exec, a, 30000, 500), 60500);
    json_object_del(a, "timeout_ms");
    assert_int_equal(sf_tool_wait_ms(exec, a, 30000, 500), 60500);
    assert_int_equal(sf_tool_wait_ms(list, a, 30000, 500), 30000);
    assert_int_equal(sf_tool_wait_ms(NULL, a, 30000, 500), 30000);
    json_decref(a);
}

static void handlers_must_match(void **state)
{
    const sf_tool_handler ok[] = {{"sandbox_create", NULL}, {"sandbox_list", NULL},
                                  {"sandbox_info", NULL}};
    const sf_tool_handler missing[] = {{"sandbox_create", NULL}, {"sandbox_list", NULL}};
    const sf_tool_handler extra[] = {{"sandbox_create", NULL}, {"sandbox_list", NULL},
                                     {"sandbox_info", NULL}, {"sandbox_exec", NULL}};
    char why[512];

    /* the real scheduler's set is larger; check only the shape of the answers */
    if (sf_toolset_check_handlers(&real, SF_RUNS_SCHEDULER, ok, 3, why, sizeof(why)) < 0)
        assert_non_null(strstr(why, "declares runs: scheduler"));
    assert_int_equal(sf_toolset_check_handlers(&real, SF_RUNS_SCHEDULER, missing, 2, why,
                                               sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "no handler"));
    assert_int_equal(sf_toolset_check_handlers(&real, SF_RUNS_GATEWAY, extra + 3, 1, why,
                                               sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "sandbox_exec"));
    assert_int_equal(sf_toolset_check_handlers(&real, SF_RUNS_GATEWAY, NULL, 0, why, sizeof(why)),
                     0);
    assert_non_null(sf_tool_handler_find(ok, 3, "sandbox_info"));
    assert_null(sf_tool_handler_find(ok, 3, "sandbox_exec"));
}

/* Writes one schema file into a fresh folder and loads it: the load's rc and why. */
static int load_one(const char *text, char *why, size_t whylen)
{
    char dir[] = "/tmp/sf-tools-XXXXXX", path[256];
    sf_toolset set;
    FILE *f;
    int rc;

    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/t.json", dir);
    assert_non_null(f = fopen(path, "w"));
    fputs(text, f);
    fclose(f);
    rc = sf_toolset_load(&set, dir, why, whylen);
    if (rc == 0)
        sf_toolset_fini(&set);
    unlink(path);
    rmdir(dir);
    return rc;
}

#define HEAD "{\"title\": \"t\", \"type\": \"object\", \"properties\": {\"sandbox_id\": {\"type\": " \
             "\"string\"}, \"data\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}}, "

static void bad_declarations_are_refused(void **state)
{
    static const struct {
        const char *text, *why;
    } cases[] = {
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\"}}", NULL},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"claim_check\": [\"data\"], "
              "\"wait\": {\"arg\": \"n\", \"default\": 5, \"max\": 9}, \"resume\": true}}", NULL},
        {HEAD "\"x-annotations\": {}}", "'x-sandfleet' (where the tool runs) is missing"},
        {HEAD "\"x-sandfleet\": {}}", "'x-sandfleet.runs' is required"},
        {HEAD "\"x-sandfleet\": {\"runs\": \"moon\"}}", "'x-sandfleet.runs' has a wrong value"},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"color\": 1}}", "unknown key 'x-sandfleet.color'"},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"summary\": \"what it does\"}}", NULL},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"summary\": 7}}",
         "'x-sandfleet.summary' has a wrong value"},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"claim_check\": [\"nope\"]}}",
         "'x-sandfleet.claim_check' has a wrong value"},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"wait\": {\"arg\": \"n\", \"default\": 9, "
              "\"max\": 5}}}", "'x-sandfleet.wait' has a wrong value"},
        {HEAD "\"x-sandfleet\": {\"runs\": \"worker\", \"output\": {\"type\": \"object\", "
              "\"requird\": []}}}", "'x-sandfleet.output' has a wrong value"},
        {"{\"title\": \"t\", \"type\": \"object\", \"x-sandfleet\": {\"runs\": \"worker\", "
         "\"sandbox\": \"existing\"}}", "needs a 'sandbox_id' argument"},
        {"{\"title\": \"sf.cancel\", \"type\": \"object\", \"x-sandfleet\": {\"runs\": \"worker\"}}",
         "declared twice"},
    };
    char why[512];

    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        why[0] = '\0';
        int rc = load_one(cases[i].text, why, sizeof(why));
        if (!cases[i].why) {
            if (rc != 0)
                fail_msg("case %zu: %s", i, why);
            continue;
        }
        assert_int_equal(rc, -EINVAL);
        if (!strstr(why, cases[i].why))
            fail_msg("case %zu: '%s' lacks '%s'", i, why, cases[i].why);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(real_declarations),
        cmocka_unit_test(wait_follows_the_declaration),
        cmocka_unit_test(handlers_must_match),
        cmocka_unit_test(bad_declarations_are_refused),
    };
    return cmocka_run_group_tests(tests, load_real, free_real);
}
