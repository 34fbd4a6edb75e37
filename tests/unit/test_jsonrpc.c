/* sf_jsonrpc: what the gateway accepts as one JSON-RPC message, and what it answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sf_jsonrpc.h"

#include <string.h>

static int parse(const char *body, sf_rpc_msg *m, char *why)
{
    why[0] = '\0';
    return sf_rpc_parse(body, strlen(body), m, why, 256);
}

static void kinds(void **state)
{
    sf_rpc_msg m;
    char why[256];

    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}", &m, why), 0);
    assert_int_equal(m.kind, SF_RPC_REQUEST);
    assert_int_equal(json_integer_value(m.id), 7);
    assert_string_equal(m.method, "ping");
    assert_null(m.params);
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"tools/call\","
                           "\"params\":{\"name\":\"x\"}}", &m, why), 0);
    assert_string_equal(json_string_value(m.id), "a");
    assert_true(json_is_object(m.params));
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", &m,
                           why), 0);
    assert_int_equal(m.kind, SF_RPC_NOTIFICATION);
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"x\",\"params\":[1]}", &m,
                           why), 0); /* a notification: never answered, whatever its params */
    assert_int_equal(m.kind, SF_RPC_NOTIFICATION);
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}", &m, why), 0);
    assert_int_equal(m.kind, SF_RPC_RESPONSE);
    sf_rpc_msg_fini(&m);
}

static void refusals(void **state)
{
    static const struct {
        const char *body;
        int code;
        const char *why;
        int has_id;
    } cases[] = {
        {"{\"jsonrpc\":\"2.0\",", SF_RPC_PARSE_ERROR, "not valid JSON", 0},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ping\"}", SF_RPC_PARSE_ERROR,
         "not valid JSON", 0},
        {"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]", SF_RPC_INVALID_REQUEST,
         "batches are not supported", 0},
        {"{\"id\":1,\"method\":\"ping\"}", SF_RPC_INVALID_REQUEST, "\"jsonrpc\": \"2.0\"", 0},
        {"\"2.0\"", SF_RPC_PARSE_ERROR, "not valid JSON", 0}, /* objects only */
        {"{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"ping\"}", SF_RPC_INVALID_REQUEST,
         "'id' must be a string or an integer", 0},
        {"{\"jsonrpc\":\"2.0\",\"id\":1}", SF_RPC_INVALID_REQUEST, "'method' is missing", 1},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}", SF_RPC_INVALID_REQUEST,
         "'method' must be a string", 1},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":[1]}",
         SF_RPC_INVALID_PARAMS, "'params' must be an object", 1},
    };
    sf_rpc_msg m;
    char why[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = parse(cases[i].body, &m, why);
        if (rc != cases[i].code || !strstr(why, cases[i].why) || !!m.id != cases[i].has_id)
            fail_msg("%s: got %d '%s' id=%d", cases[i].body, rc, why, !!m.id);
        sf_rpc_msg_fini(&m);
    }
}

/* The fast path for the fixed shapes of ping and tools/list: what it accepts is what the
 * full parser reads, and every other shape goes to the full parser (same answer as before). */
static void fixed_shapes(void **state)
{
    static const char *const bodies[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}",
        " {\r\n \"method\" : \"ping\" ,\t\"id\":\"abc-1\", \"jsonrpc\":\"2.0\"}\n",
        "{\"id\":-42,\"jsonrpc\":\"2.0\",\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":123456789012345678,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1234567890123456789,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":-0,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":01,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1.0,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1e2,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":-,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":\"a\\\"b\",\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":\"\",\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{}}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"cursor\":\"x\"}}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":1}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"} x",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",}",
        "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}",
        "{\"id\":1,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pong\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\\u0000\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}",
        "{\"jsonrpc\":\"2.0\" \"id\":1,\"method\":\"ping\"}",
    };
    sf_rpc_msg m;
    char why[256];

    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        json_t *ref = json_loads(bodies[i], JSON_REJECT_DUPLICATES, NULL);
        int rc = parse(bodies[i], &m, why);

        if (!ref) {
            if (rc != SF_RPC_PARSE_ERROR)
                fail_msg("%s: jansson refuses it, got %d", bodies[i], rc);
        } else if (rc == 0 && m.kind == SF_RPC_REQUEST) {
            json_t *params = json_object_get(ref, "params");
            if (!json_equal(m.id, json_object_get(ref, "id")) ||
                strcmp(m.method, json_string_value(json_object_get(ref, "method"))) != 0 ||
                !m.params != !params)
                fail_msg("%s: not what jansson reads", bodies[i]);
        }
        sf_rpc_msg_fini(&m);
        json_decref(ref);
    }
    /* the shapes of the hot path give what the handlers use */
    assert_int_equal(parse(bodies[1], &m, why), 0);
    assert_int_equal(m.kind, SF_RPC_REQUEST);
    assert_string_equal(json_string_value(m.id), "abc-1");
    assert_string_equal(m.method, "ping");
    assert_null(m.params);
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse(bodies[3], &m, why), 0);
    assert_int_equal(json_integer_value(m.id), 123456789012345678LL);
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse(bodies[16], &m, why), SF_RPC_PARSE_ERROR); /* a duplicate */
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse(bodies[21], &m, why), SF_RPC_INVALID_REQUEST); /* not 2.0 */
    sf_rpc_msg_fini(&m);
    assert_int_equal(parse(bodies[26], &m, why), 0); /* null id: a notification */
    assert_int_equal(m.kind, SF_RPC_NOTIFICATION);
    sf_rpc_msg_fini(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kinds),
        cmocka_unit_test(refusals),
        cmocka_unit_test(fixed_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
