/* cli/toml.c: the TOML edit behind `sandfleet connect codex --write`. What it writes is
 * also parsed by a real TOML parser in tests/e2e/connect.test.mjs. */
#include "toml.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static const cli_toml_kv kv[] = {{"url", "http://127.0.0.1:8080/mcp"},
                                 {"bearer_token_env_var", "SANDFLEET_API_KEY"}};
static const char *const drop[] = {"command", "args", "env", "bearer_token", "http_headers"};
static const char table_text[] = "[mcp_servers.sandfleet]\n"
                                 "url = \"http://127.0.0.1:8080/mcp\"\n"
                                 "bearer_token_env_var = \"SANDFLEET_API_KEY\"\n";

static char *set(const char *in, int want_rc, char *why)
{
    char *out = NULL;
    char local[512];

    assert_int_equal(cli_toml_set_table(in, strlen(in), "mcp_servers.sandfleet", kv, 2, drop, 5,
                                        &out, why ? why : local, 512),
                     want_rc);
    return out;
}

static void test_empty_and_append(void **state)
{
    char *out = set("", 0, NULL);
    assert_string_equal(out, table_text);
    free(out);
    out = set("model = \"o3\"\n[mcp_servers.other]\ncommand = \"x\"", 0, NULL);
    assert_string_equal(out, "model = \"o3\"\n[mcp_servers.other]\ncommand = \"x\"\n\n[mcp_servers."
                             "sandfleet]\nurl = \"http://127.0.0.1:8080/mcp\"\nbearer_token_env_var "
                             "= \"SANDFLEET_API_KEY\"\n");
    free(out);
}

static void test_replace_in_place_keeping_other_keys(void **state)
{
    const char *in = "# mine\n"
                     "[mcp_servers.sandfleet] # old\n"
                     "command = \"npx\"\n"
                     "args = [\n"
                     "  \"-y\",\n"
                     "  [\"nested\"],\n"
                     "]\n"
                     "tool_timeout_sec = 120\n"
                     "url = 'http://old/mcp'\n"
                     "\n"
                     "[mcp_servers.sandfleet.env]\n"
                     "X = \"1\"\n"
                     "[mcp_servers.sandfleet.tools.foo]\n"
                     "enabled = true\n"
                     "[profile]\n"
                     "notes = \"\"\"\n"
                     "[mcp_servers.sandfleet]\n"
                     "\"\"\"\n";
    char *out = set(in, 0, NULL);
    assert_string_equal(out, "# mine\n"
                             "[mcp_servers.sandfleet]\n"
                             "url = \"http://127.0.0.1:8080/mcp\"\n"
                             "bearer_token_env_var = \"SANDFLEET_API_KEY\"\n"
                             "tool_timeout_sec = 120\n"
                             "\n"
                             "[mcp_servers.sandfleet.tools.foo]\n"
                             "enabled = true\n"
                             "[profile]\n"
                             "notes = \"\"\"\n"
                             "[mcp_servers.sandfleet]\n"
                             "\"\"\"\n");
    /* the same edit again changes nothing */
    char *again = set(out, 0, NULL);
    assert_string_equal(again, out);
    free(again);
    free(out);
}

static void test_refusals(void **state)
{
    char why[512];

    set("mcp_servers.sandfleet.url = \"x\"\n", -EEXIST, why);
    assert_non_null(strstr(why, "line 1"));
    set("[mcp_servers]\nsandfleet = { url = \"x\" }\n", -EEXIST, why);
    assert_non_null(strstr(why, "line 2"));
    set("[[mcp_servers.sandfleet]]\nurl = \"x\"\n", -EEXIST, why);
    set("[mcp_servers.sandfleet]\n[mcp_servers.sandfleet]\n", -EEXIST, why);
    set("a = \"no end\n", -EINVAL, why);
    set("a = [1,\n2\n", -EINVAL, why);
    assert_non_null(strstr(why, "does not end"));
    set("just words\n", -EINVAL, why);
}

static void test_escapes_and_crlf(void **state)
{
    static const cli_toml_kv odd[] = {{"url", "http://h/\"q\"\\\x01"}};
    const char *in = "a = 1\r\n[x]\r\nb = 'c'\r\n";
    char *out = NULL, why[256];

    assert_int_equal(cli_toml_set_table(in, strlen(in), "t", odd, 1, NULL, 0, &out, why, sizeof(why)),
                     0);
    assert_string_equal(out, "a = 1\r\n[x]\r\nb = 'c'\r\n\n[t]\nurl = \"http://h/\\\"q\\\"\\\\\\u0001\"\n");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_and_append),
        cmocka_unit_test(test_replace_in_place_keeping_other_keys),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_escapes_and_crlf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
