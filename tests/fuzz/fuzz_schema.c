/* Fuzz harness for common/sf_schema.c.
 *
 * Input: a schema and an instance, both JSON text, separated by the first NUL byte (no
 * NUL: the whole input is the instance, checked against a fixed tool-like schema). A
 * schema that passes sf_schema_check() is then used to validate the instance; every
 * answer must be 0 or -EINVAL/-ENOMEM with a NUL-terminated sentence.
 *
 * Built with -DSF_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target; otherwise
 * tests/fuzz/replay.c gives it a main() that replays files (or directories). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sf_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fixed_schema[] =
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9_-]+$\","
    "\"maxLength\":8},\"n\":{\"type\":[\"integer\",\"null\"],\"minimum\":1,\"exclusiveMaximum\":9},"
    "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},\"propertyNames\":"
    "{\"pattern\":\"^[A-Z_]+$\"},\"maxProperties\":4},\"list\":{\"type\":\"array\",\"items\":"
    "{\"enum\":[\"a\",1,null]},\"maxItems\":3},\"c\":{\"const\":{\"k\":[1]}}},\"required\":[\"id\"],"
    "\"additionalProperties\":false}";

static void check_why(const char *why, size_t len)
{
    if (memchr(why, '\0', len) == NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    json_t *schema, *inst;
    char why[256];
    int rc;

    if (nul) {
        schema = json_loadb((const char *)data, (size_t)(nul - data), JSON_DECODE_ANY, NULL);
        inst = json_loadb((const char *)nul + 1, size - (size_t)(nul - data) - 1,
                          JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    } else {
        schema = json_loads(fixed_schema, 0, NULL);
        inst = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    }
    if (schema) {
        memset(why, 'Z', sizeof(why));
        rc = sf_schema_check(schema, why, sizeof(why));
        if (rc != 0) {
            if (rc != -EINVAL && rc != -ENOMEM)
                abort();
            check_why(why, sizeof(why));
        } else if (inst) {
            memset(why, 'Z', sizeof(why));
            rc = sf_schema_validate(schema, inst, why, sizeof(why));
            if (rc != 0 && rc != -EINVAL && rc != -ENOMEM)
                abort();
            if (rc != 0)
                check_why(why, sizeof(why));
        }
    }
    json_decref(schema);
    json_decref(inst);
    return 0;
}
