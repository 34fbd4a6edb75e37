/* Tests for common/sf_schema.c: each keyword accepts and rejects, and the sentences name
 * the right field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sf_schema.h"

static const char exec_schema[] =
    "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\","
    "\"title\":\"sandbox_exec\",\"description\":\"Run a command\",\"x-sf-tool\":true,"
    "\"properties\":{"
    "\"sandbox_id\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":64,"
    "\"pattern\":\"^[a-z0-9_-]+$\",\"description\":\"id\"},"
    "\"command\":{\"type\":\"string\",\"minLength\":1},"
    "\"cwd\":{\"type\":\"string\",\"default\":\"/\"},"
    "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},"
    "\"propertyNames\":{\"maxLength\":16,\"pattern\":\"^[A-Za-z_][A-Za-z0-9_]*$\"},"
    "\"maxProperties\":3},"
    "\"timeout_ms\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":600000,\"examples\":[1000]}},"
    "\"required\":[\"sandbox_id\",\"command\"],\"additionalProperties\":false}";

static json_t *J(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!j)
        fail_msg("bad JSON in test: %s: %s", text, err.text);
    return j;
}

static void ok(const char *schema, const char *inst)
{
    json_t *s = J(schema), *x = J(inst);
    char why[512] = "";

    if (sf_schema_check(s, why, sizeof(why)) != 0)
        fail_msg("schema check failed: %s", why);
    if (sf_schema_validate(s, x, why, sizeof(why)) != 0)
        fail_msg("%s rejected: %s", inst, why);
    json_decref(s);
    json_decref(x);
}

static void bad(const char *schema, const char *inst, const char *expect)
{
    json_t *s = J(schema), *x = J(inst);
    char why[512] = "";

    if (sf_schema_check(s, why, sizeof(why)) != 0)
        fail_msg("schema check failed: %s", why);
    why[0] = '\0';
    assert_int_equal(sf_schema_validate(s, x, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, expect);
    json_decref(s);
    json_decref(x);
}

static void bad_schema(const char *schema, const char *expect)
{
    json_t *s = J(schema);
    char why[512] = "";

    assert_int_equal(sf_schema_check(s, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, expect);
    json_decref(s);
}

static void test_exec_schema(void **state)
{
    const char *S = exec_schema;

    ok(S, "{\"sandbox_id\":\"sb_1\",\"command\":\"ls\"}");
    ok(S, "{\"sandbox_id\":\"sb_1\",\"command\":\"ls\",\"cwd\":\"/tmp\",\"env\":{\"FOO\":\"1\","
          "\"_b2\":\"x\"},\"timeout_ms\":600000}");
    bad(S, "{\"sandbox_id\":\"sb_1\",\"command\":\"ls\",\"timeout_ms\":\"5\"}",
        "Argument 'timeout_ms' must be an integer (got string).");
    bad(S, "{\"sandbox_id\":\"sb_1\"}", "Argument 'command' is required.");
    bad(S, "{\"sandbox_id\":\"sb_1\",\"command\":\"ls\",\"env\":{\"FOO\":1}}",
        "Argument 'env.FOO' must be a string (got integer).");
    bad(S, "{\"sandbox_id\":\"sb_1\",\"comand\":\"ls\"}",
        "Unknown argument 'comand'; valid arguments are: sandbox_id, command, cwd, env, timeout_ms.");
    bad(S, "{\"sandbox_id\":\"sb_1\",\"command\":\"ls\",\"timeout_ms\":600001}",
        "Argument 'timeout_ms' must be at most 600000.");
    bad(S, "{\"sandbox_id\":\"sb_1\",\"command\":\"ls\",\"timeout_ms\":0}",
        "Argument 'timeout_ms' must be at least 1.");
    bad(S, "{\"sandbox_id\":\"\",\"command\":\"ls\"}",
        "Argument 'sandbox_id' must be at least 1 character long.");
    bad(S, "{\"sandbox_id\":\"SB 1\",\"command\":\"ls\"}",
        "Argument 'sandbox_id' must match the pattern ^[a-z0-9_-]+$.");
    bad(S, "{\"sandbox_id\":\"sb\",\"command\":\"ls\",\"env\":{\"A B\":\"1\"}}",
        "Key 'A B' in argument 'env' must match the pattern ^[A-Za-z_][A-Za-z0-9_]*$.");
    bad(S, "{\"sandbox_id\":\"sb\",\"command\":\"ls\",\"env\":{\"ABCDEFGHIJKLMNOPQ\":\"1\"}}",
        "Key 'ABCDEFGHIJKLMNOPQ' in argument 'env' must be at most 16 characters long.");
    bad(S, "{\"sandbox_id\":\"sb\",\"command\":\"ls\",\"env\":{\"A\":\"1\",\"B\":\"1\",\"C\":\"1\",\"D\":\"1\"}}",
        "Argument 'env' must have at most 3 entries (got 4).");
    bad(S, "[1]", "Arguments must be an object (got array).");
    bad(S, "null", "Arguments must be an object (got null).");
}

static void test_types(void **state)
{
    static const struct {
        const char *type, *good, *bad, *expect;
    } cases[] = {
        {"object", "{}", "[]", "Argument 'v' must be an object (got array)."},
        {"array", "[1]", "{}", "Argument 'v' must be an array (got object)."},
        {"string", "\"s\"", "1", "Argument 'v' must be a string (got integer)."},
        {"integer", "-3", "1.5", "Argument 'v' must be an integer (got number)."},
        {"number", "1.5", "\"1.5\"", "Argument 'v' must be a number (got string)."},
        {"boolean", "false", "0", "Argument 'v' must be a boolean (got integer)."},
        {"null", "null", "false", "Argument 'v' must be null (got boolean)."},
    };
    char schema[256], inst[128];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(schema, sizeof(schema), "{\"properties\":{\"v\":{\"type\":\"%s\"}}}", cases[i].type);
        snprintf(inst, sizeof(inst), "{\"v\":%s}", cases[i].good);
        ok(schema, inst);
        snprintf(inst, sizeof(inst), "{\"v\":%s}", cases[i].bad);
        bad(schema, inst, cases[i].expect);
    }
    /* a list of types */
    ok("{\"properties\":{\"v\":{\"type\":[\"integer\",\"null\"]}}}", "{\"v\":null}");
    ok("{\"properties\":{\"v\":{\"type\":[\"integer\",\"null\"]}}}", "{\"v\":7}");
    bad("{\"properties\":{\"v\":{\"type\":[\"integer\",\"null\"]}}}", "{\"v\":\"7\"}",
        "Argument 'v' must be an integer or null (got string).");
    bad("{\"properties\":{\"v\":{\"type\":[\"string\",\"integer\",\"null\"]}}}", "{\"v\":[]}",
        "Argument 'v' must be a string, an integer or null (got array).");
    /* no type: anything */
    ok("{\"properties\":{\"v\":{}}}", "{\"v\":[1,{\"a\":null}]}");
}

static void test_integer_vs_number(void **state)
{
    /* 1.0 is a number, not an integer (documented choice); every integer is a number */
    bad("{\"type\":\"integer\"}", "1.0", "Arguments must be an integer (got number).");
    bad("{\"type\":\"integer\"}", "1e3", "Arguments must be an integer (got number).");
    ok("{\"type\":\"number\"}", "1.0");
    ok("{\"type\":\"number\"}", "5");
    ok("{\"type\":\"integer\"}", "-9223372036854775807");
    /* bounds compare integers exactly and mix with reals */
    ok("{\"type\":\"integer\",\"maximum\":9223372036854775807}", "9223372036854775807");
    bad("{\"type\":\"integer\",\"maximum\":9223372036854775806}", "9223372036854775807",
        "Arguments must be at most 9223372036854775806.");
    ok("{\"type\":\"number\",\"minimum\":0.5}", "1");
    bad("{\"type\":\"number\",\"minimum\":0.5}", "0", "Arguments must be at least 0.5.");
}

static void test_numbers(void **state)
{
    const char *S = "{\"properties\":{\"n\":{\"type\":\"number\",\"exclusiveMinimum\":0,"
                    "\"exclusiveMaximum\":10.5}}}";
    ok(S, "{\"n\":0.001}");
    ok(S, "{\"n\":10.4}");
    bad(S, "{\"n\":0}", "Argument 'n' must be greater than 0.");
    bad(S, "{\"n\":-1}", "Argument 'n' must be greater than 0.");
    bad(S, "{\"n\":10.5}", "Argument 'n' must be less than 10.5.");
    ok("{\"minimum\":1,\"maximum\":1}", "1");
    /* numeric keywords do not apply to other types */
    ok("{\"minimum\":1}", "\"abc\"");
}

static void test_enum_const(void **state)
{
    const char *S = "{\"properties\":{\"encoding\":{\"type\":\"string\",\"enum\":[\"text\",\"base64\"]},"
                    "\"n\":{\"enum\":[1,2,null]},\"v\":{\"const\":{\"a\":[1]}}}}";
    ok(S, "{\"encoding\":\"text\",\"n\":null,\"v\":{\"a\":[1]}}");
    ok(S, "{\"n\":2}");
    bad(S, "{\"encoding\":\"utf8\"}", "Argument 'encoding' must be one of: text, base64.");
    bad(S, "{\"n\":3}", "Argument 'n' must be one of: 1, 2, null.");
    bad(S, "{\"n\":1.0}", "Argument 'n' must be one of: 1, 2, null.");
    bad(S, "{\"v\":{\"a\":[2]}}", "Argument 'v' must be {\"a\":[1]}.");
}

static void test_strings(void **state)
{
    const char *S = "{\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}}}";
    ok(S, "{\"s\":\"ab\"}");
    ok(S, "{\"s\":\"h\\u00e9llo\"}"); /* 5 code points, 6 bytes */
    ok(S, "{\"s\":\"\\u65e5\\u672c\\u8a9e\"}");
    bad(S, "{\"s\":\"a\"}", "Argument 's' must be at least 2 characters long.");
    bad(S, "{\"s\":\"abcdef\"}", "Argument 's' must be at most 5 characters long.");
    bad(S, "{\"s\":\"\\u65e5\\u672c\\u8a9e\\u65e5\\u672c\\u8a9e\"}",
        "Argument 's' must be at most 5 characters long.");
    bad("{\"maxLength\":1}", "\"ab\"", "Arguments must be at most 1 character long.");
    /* string keywords do not apply to numbers */
    ok(S, "{\"s2\":1}");
}

/* x-maxBytes bounds what is stored, in bytes of UTF-8, on top of maxLength. */
static void test_max_bytes(void **state)
{
    const char *S = "{\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":4,"
                    "\"x-maxBytes\":4},\"m\":{\"type\":\"object\",\"propertyNames\":"
                    "{\"x-maxBytes\":2},\"additionalProperties\":{\"x-maxBytes\":3}}}}";
    ok(S, "{\"s\":\"abcd\"}");
    ok(S, "{\"s\":\"h\u00e9l\"}"); /* 3 characters, 4 bytes */
    bad(S, "{\"s\":\"h\u00e9ll\"}", "Argument 's' must be at most 4 bytes long in UTF-8 (got 5).");
    bad(S, "{\"s\":\"\u65e5\u672c\"}", "Argument 's' must be at most 4 bytes long in UTF-8 (got 6).");
    ok(S, "{\"m\":{\"ab\":\"xyz\"}}");
    bad(S, "{\"m\":{\"abc\":\"x\"}}",
        "Key 'abc' in argument 'm' must be at most 2 bytes long in UTF-8 (got 3).");
    bad(S, "{\"m\":{\"a\":\"wxyz\"}}", "Argument 'm.a' must be at most 3 bytes long in UTF-8 (got 4).");
    /* a long key is quoted up to 64 bytes, never cut inside a character */
    bad(S, "{\"m\":{\"a\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9"
           "\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9"
           "\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\":\"x\"}}",
        "Key 'a\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
        "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9' in argument 'm' "
        "must be at most 2 bytes long in UTF-8 (got 67).");
    /* on an object: keys and string values together */
    const char *T = "{\"properties\":{\"m\":{\"type\":\"object\",\"x-maxBytes\":6}}}";
    ok(T, "{\"m\":{\"ab\":\"cd\",\"e\":\"f\"}}");
    ok(T, "{\"m\":{\"abc\":1}}"); /* other values count nothing */
    bad(T, "{\"m\":{\"ab\":\"cd\",\"e\":\"fg\"}}",
        "Argument 'm' must take at most 6 bytes of keys and values in all (got 7); shorten or "
        "drop some.");
    bad_schema("{\"x-maxBytes\":\"big\"}",
               "Schema error at the top level: 'x-maxBytes' must be a non-negative integer.");
}

static void test_pattern(void **state)
{
    const char *S = "{\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"b+c\"},"
                    "\"a\":{\"pattern\":\"^[0-9]{1,3}(\\\\.[0-9]{1,3}){3}$\"}}}";
    ok(S, "{\"p\":\"abbbcd\"}"); /* unanchored, as in JSON Schema */
    ok(S, "{\"a\":\"10.0.0.1\"}");
    bad(S, "{\"p\":\"ac\"}", "Argument 'p' must match the pattern b+c.");
    bad(S, "{\"a\":\"10.0.0\"}", "Argument 'a' must match the pattern ^[0-9]{1,3}(\\.[0-9]{1,3}){3}$.");
    /* the cached regex gives the same answers the second time */
    ok(S, "{\"p\":\"bc\"}");
    bad(S, "{\"p\":\"b\"}", "Argument 'p' must match the pattern b+c.");
    /* an embedded NUL does not end the subject early */
    bad("{\"pattern\":\"^[a-z]*$\"}", "\"ab\\u0000cd\"", "Arguments must match the pattern ^[a-z]*$.");
    bad_schema("{\"pattern\":\"^\\\\d+$\"}",
               "Schema error at the top level: 'pattern' ^\\d+$: \\d is not POSIX: write [0-9] "
               "(or [^0-9] for \\D).");
    bad_schema("{\"pattern\":\"^a+?$\"}",
               "Schema error at the top level: 'pattern' ^a+?$: stacks quantifiers (like +? or "
               "a{2}*), which POSIX and JSON Schema read differently.");
    bad_schema("{\"pattern\":\"^(ab){2}*$\"}",
               "Schema error at the top level: 'pattern' ^(ab){2}*$: stacks quantifiers (like +? or "
               "a{2}*), which POSIX and JSON Schema read differently.");
    bad_schema("{\"pattern\":\"^a{1,1001}$\"}",
               "Schema error at the top level: 'pattern' ^a{1,1001}$: uses a repetition bound over "
               "1000.");
    /* quantifier characters inside brackets or escaped are literals */
    ok("{\"pattern\":\"^[+*?]+\\\\+[]a]{1,3}[[:alpha:]+]*$\"}", "\"?*+]ax+\"");
    bad_schema("{\"properties\":{\"x\":{\"pattern\":\"a(b\"}}}",
               "Schema error at 'properties.x': 'pattern' a(b is not a valid POSIX extended "
               "regular expression.");
    bad_schema("{\"pattern\":\"(?:ab)\"}",
               "Schema error at the top level: 'pattern' (?:ab) is not a valid POSIX extended "
               "regular expression.");
    sf_schema_cache_clear();
    ok(S, "{\"p\":\"bc\"}"); /* recompiles after a clear */
}

static void test_arrays(void **state)
{
    const char *S = "{\"properties\":{\"allow_out\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
                    "\"minLength\":1},\"maxItems\":3},\"coordinate\":{\"type\":\"array\","
                    "\"items\":{\"type\":\"integer\",\"minimum\":0},\"minItems\":2,\"maxItems\":2}}}";
    ok(S, "{\"allow_out\":[],\"coordinate\":[0,5]}");
    ok(S, "{\"allow_out\":[\"*.example.com\",\"10.0.0.0/8\"]}");
    bad(S, "{\"allow_out\":[\"a\",2]}", "Argument 'allow_out[1]' must be a string (got integer).");
    bad(S, "{\"allow_out\":[\"a\",\"\"]}", "Argument 'allow_out[1]' must be at least 1 character long.");
    bad(S, "{\"allow_out\":[\"a\",\"b\",\"c\",\"d\"]}", "Argument 'allow_out' must have at most 3 items (got 4).");
    bad(S, "{\"coordinate\":[1]}", "Argument 'coordinate' must have at least 2 items (got 1).");
    bad(S, "{\"coordinate\":[1,-1]}", "Argument 'coordinate[1]' must be at least 0.");
    bad("{\"minItems\":1}", "[]", "Arguments must have at least 1 item (got 0).");
}

static void test_objects(void **state)
{
    const char *S = "{\"type\":\"object\",\"properties\":{\"opts\":{\"type\":\"object\",\"properties\":"
                    "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"object\",\"additionalProperties\":"
                    "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}},\"additionalProperties\":false,"
                    "\"required\":[\"a\"]},\"meta\":{\"type\":\"object\"}},\"additionalProperties\":false}";
    ok(S, "{\"opts\":{\"a\":1,\"b\":{\"x\":[\"1\"],\"y\":[]}},\"meta\":{\"any\":{\"thing\":[1]}}}");
    bad(S, "{\"opts\":{\"a\":1,\"c\":2}}", "Unknown argument 'opts.c'; valid keys of 'opts' are: a, b.");
    bad(S, "{\"opts\":{}}", "Argument 'opts.a' is required.");
    bad(S, "{\"opts\":{\"a\":1,\"b\":{\"x\":[\"1\",2]}}}", "Argument 'opts.b.x[1]' must be a string (got integer).");
    bad(S, "{\"opts\":{\"a\":1,\"b\":{\"x\":\"1\"}}}", "Argument 'opts.b.x' must be an array (got string).");
    /* no properties at all */
    bad("{\"type\":\"object\",\"additionalProperties\":false}", "{\"x\":1}",
        "Unknown argument 'x'; this tool takes no arguments.");
    bad("{\"properties\":{\"o\":{\"additionalProperties\":false}}}", "{\"o\":{\"k\":1}}",
        "Unknown argument 'o.k'; 'o' takes no keys.");
    /* additionalProperties absent or true allows anything */
    ok("{\"properties\":{\"a\":{\"type\":\"string\"}}}", "{\"a\":\"x\",\"b\":1}");
    ok("{\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":true}", "{\"b\":1}");
    /* min/maxProperties */
    bad("{\"minProperties\":1}", "{}", "Arguments must have at least 1 entry.");
    bad("{\"maxProperties\":1}", "{\"a\":1,\"b\":2}", "Arguments must have at most 1 entry (got 2).");
    /* propertyNames at the top level */
    bad("{\"propertyNames\":{\"pattern\":\"^[a-z]+$\"}}", "{\"ok\":1,\"Not\":2}",
        "Argument name 'Not' must match the pattern ^[a-z]+$.");
    /* boolean schemas */
    bad("{\"properties\":{\"x\":false}}", "{\"x\":1}", "Argument 'x' is not allowed.");
    ok("{\"properties\":{\"x\":true}}", "{\"x\":[1]}");
}

static json_t *nest(int levels)
{
    json_t *j = json_integer(1);
    for (int i = 0; i < levels; i++) {
        json_t *a = json_array();
        json_array_append_new(a, j);
        j = a;
    }
    return j;
}

static void test_depth(void **state)
{
    json_t *any = J("{}"), *items = J("{\"items\":{\"items\":{}}}"), *t = json_true();
    json_t *ok32 = nest(SF_SCHEMA_MAX_DEPTH), *deep = nest(SF_SCHEMA_MAX_DEPTH + 1);
    json_t *obj = json_object();
    char why[512];

    assert_int_equal(sf_schema_validate(any, ok32, why, sizeof(why)), 0);
    assert_int_equal(sf_schema_validate(any, deep, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "is nested too deeply (the limit is 32 levels)."));
    assert_int_equal(strncmp(why, "Argument '[0][0][0]", 19), 0);
    assert_int_equal(sf_schema_validate(items, deep, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "nested too deeply"));
    assert_int_equal(sf_schema_validate(t, deep, why, sizeof(why)), -EINVAL);
    /* inside an object property */
    json_object_set(obj, "data", deep);
    assert_int_equal(sf_schema_validate(any, obj, why, sizeof(why)), -EINVAL);
    assert_int_equal(strncmp(why, "Argument 'data[0]", 17), 0);
    json_decref(obj);
    json_decref(any);
    json_decref(items);
    json_decref(t);
    json_decref(ok32);
    json_decref(deep);

    /* a schema nested too deeply fails the check */
    {
        char text[4096];
        size_t n = 0;
        for (int i = 0; i < 40; i++)
            n += (size_t)snprintf(text + n, sizeof(text) - n, "{\"items\":");
        n += (size_t)snprintf(text + n, sizeof(text) - n, "{}");
        for (int i = 0; i < 40; i++)
            n += (size_t)snprintf(text + n, sizeof(text) - n, "}");
        json_t *s = J(text);
        assert_int_equal(sf_schema_check(s, why, sizeof(why)), -EINVAL);
        assert_non_null(strstr(why, "the schema is nested too deeply"));
        json_decref(s);
    }
}

/* $defs and "#/$defs/NAME" references (the conformance suite's json_schema_2020_12_tool) */
static void test_defs_ref(void **state)
{
    static const char s[] =
        "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\","
        "\"$defs\":{\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":"
        "\"string\"},\"city\":{\"type\":\"string\"}}}},\"properties\":{\"name\":{\"type\":"
        "\"string\"},\"address\":{\"$ref\":\"#/$defs/address\"}},\"additionalProperties\":false}";
    static const char loop[] = "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}";

    (void)state;
    ok(s, "{\"name\":\"x\",\"address\":{\"street\":\"a\",\"city\":\"b\"}}");
    bad(s, "{\"address\":{\"city\":5}}",
        "Argument 'address.city' must be a string (got integer).");
    bad(s, "{\"address\":7}", "Argument 'address' must be an object (got integer).");
    bad_schema("{\"properties\":{\"a\":{\"$ref\":\"#/$defs/none\"}}}",
               "Schema error at 'properties.a': '$ref' must name a schema of this one's '$defs' "
               "as \"#/$defs/NAME\".");
    bad_schema("{\"$defs\":{\"a\":{}},\"properties\":{\"x\":{\"$ref\":\"http://e/s.json\"}}}",
               "Schema error at 'properties.x': '$ref' must name a schema of this one's '$defs' "
               "as \"#/$defs/NAME\".");
    bad_schema("{\"properties\":{\"a\":{\"$defs\":{}}}}",
               "Schema error at 'properties.a': '$defs' must be an object, at the top level of "
               "the schema.");
    bad_schema("{\"$defs\":{\"a\":{\"minimun\":1}}}",
               "Schema error at '$defs.a': unsupported keyword 'minimun'.");
    { /* a reference loop ends at the depth limit, not in a crash */
        json_t *l = J(loop), *x = J("1");
        char why[512] = "";
        assert_int_equal(sf_schema_check(l, why, sizeof(why)), 0);
        assert_int_equal(sf_schema_validate(l, x, why, sizeof(why)), -EINVAL);
        json_decref(l);
        json_decref(x);
    }
}

static void test_check(void **state)
{
    json_t *s = J(exec_schema);
    char why[512];

    assert_int_equal(sf_schema_check(s, why, sizeof(why)), 0);
    json_decref(s);
    bad_schema("{\"properties\":{\"timeout_ms\":{\"type\":\"integer\",\"minimun\":1}}}",
               "Schema error at 'properties.timeout_ms': unsupported keyword 'minimun'.");
    bad_schema("{\"anyOf\":[{}]}", "Schema error at the top level: unsupported keyword 'anyOf'.");
    bad_schema("{\"type\":\"int\"}",
               "Schema error at the top level: unknown type 'int'; use object, array, string, "
               "integer, number, boolean or null.");
    bad_schema("{\"type\":[]}",
               "Schema error at the top level: 'type' must be a type name or a non-empty array of "
               "type names.");
    bad_schema("{\"type\":[\"string\",\"string\"]}",
               "Schema error at the top level: 'type' lists 'string' twice.");
    bad_schema("{\"properties\":{\"a\":{\"items\":[{}]}}}",
               "Schema error at 'properties.a': 'items' as an array (tuple form) is not supported; "
               "give one schema.");
    bad_schema("{\"properties\":{\"env\":{\"additionalProperties\":{\"type\":\"strin\"}}}}",
               "Schema error at 'properties.env.additionalProperties': unknown type 'strin'; use "
               "object, array, string, integer, number, boolean or null.");
    bad_schema("{\"exclusiveMinimum\":true}",
               "Schema error at the top level: 'exclusiveMinimum' must be a number (the draft-4 "
               "boolean form is not supported).");
    bad_schema("{\"maxLength\":-1}",
               "Schema error at the top level: 'maxLength' must be a non-negative integer.");
    bad_schema("{\"maxItems\":1.5}",
               "Schema error at the top level: 'maxItems' must be a non-negative integer.");
    bad_schema("{\"enum\":[]}", "Schema error at the top level: 'enum' must be a non-empty array.");
    bad_schema("{\"required\":\"a\"}",
               "Schema error at the top level: 'required' must be an array of property names.");
    bad_schema("{\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
               "Schema error at the top level: 'b' is required but not in 'properties', so no "
               "value could pass.");
    bad_schema("{\"properties\":[]}", "Schema error at the top level: 'properties' must be an object.");
    bad_schema("{\"properties\":{\"a\":3}}",
               "Schema error at 'properties.a': a schema must be an object or a boolean (got integer).");
    bad_schema("{\"propertyNames\":{\"maxLenght\":3}}",
               "Schema error at 'propertyNames': unsupported keyword 'maxLenght'.");
    /* annotations are fine */
    ok("{\"title\":\"t\",\"description\":\"d\",\"default\":1,\"examples\":[1],\"$id\":\"x\","
       "\"$comment\":\"c\",\"x-anything\":{\"type\":\"bogus\"}}",
       "1");
    assert_int_equal(sf_schema_check(NULL, why, sizeof(why)), -EINVAL);
}

static void test_why_buffer(void **state)
{
    json_t *s = J(exec_schema), *x = J("{\"sandbox_id\":\"sb\",\"comand\":\"ls\"}");
    char small[16];

    memset(small, 'Z', sizeof(small));
    assert_int_equal(sf_schema_validate(s, x, small, sizeof(small)), -EINVAL);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_int_equal(strncmp(small, "Unknown argumen", 15), 0);
    assert_int_equal(sf_schema_validate(s, x, NULL, 0), -EINVAL);
    assert_int_equal(sf_schema_validate(s, NULL, small, sizeof(small)), -EINVAL);
    json_decref(x);
    /* a long path is cut, not overflowed */
    {
        char key[300], text[400], why[600];
        memset(key, 'k', sizeof(key) - 1);
        key[sizeof(key) - 1] = '\0';
        json_t *map = J("{\"additionalProperties\":{\"additionalProperties\":{\"type\":\"string\"}}}");
        snprintf(text, sizeof(text), "{\"a\":{\"%s\":1}}", key);
        x = J(text);
        assert_int_equal(sf_schema_validate(map, x, why, sizeof(why)), -EINVAL);
        assert_int_equal(strncmp(why, "Argument 'a.kkk", 15), 0);
        assert_non_null(strstr(why, "k...' must be a string (got integer)."));
        json_decref(x);
        json_decref(map);
    }
    json_decref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_schema), cmocka_unit_test(test_types),
        cmocka_unit_test(test_integer_vs_number), cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_enum_const), cmocka_unit_test(test_strings),
        cmocka_unit_test(test_max_bytes),
        cmocka_unit_test(test_pattern), cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_objects), cmocka_unit_test(test_depth),
        cmocka_unit_test(test_check), cmocka_unit_test(test_why_buffer),
        cmocka_unit_test(test_defs_ref),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sf_schema_cache_clear();
    return rc;
}
