/* Fuzz harness for the gateway's JSON path, from the HTTP body to the job on Kafka:
 * gateway/sf_jsonrpc.c parses and checks the JSON-RPC message (as gateway/mcp.c does);
 * a tools/call has its arguments validated against the real tool schemas
 * (schemas/tools/, as the gateway and the scheduler do), and valid arguments are put in
 * a job envelope, encoded and decoded again, which must give the same arguments.
 * Every refusal must carry a JSON-RPC code and a sentence, and what is accepted (by the
 * fast path for fixed shapes, or by jansson) must be what jansson reads.
 *
 * Built with -DSF_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target; otherwise
 * tests/fuzz/replay.c gives it a main() that replays files (or directories). */
#include "sf_codec.h"
#include "sf_jsonrpc.h"
#include "sf_schema.h"
#include "sf_tools.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void sf_fuzz_cleanup(void);

static sf_toolset tools;
static int loaded;

static void to_job(const char *name, json_t *args)
{
    sf_job j, back;
    sf_buf b;
    const char *why = NULL;

    sf_job_init(&j);
    snprintf(j.id, sizeof(j.id), "job_fuzz");
    snprintf(j.team, sizeof(j.team), "team");
    snprintf(j.tool, sizeof(j.tool), "%s", name);
    snprintf(j.reply, sizeof(j.reply), "sf.reply.gw_fuzz");
    j.deadline_ms = 1;
    j.args = json_incref(args);
    sf_buf_init(&b, SF_MSG_MAX * 2);
    if (sf_job_encode(&j, &b) == 0) {
        if (sf_job_decode(b.p, b.len, &back, &why) != 0 || !json_equal(back.args, args))
            abort();
        sf_job_fini(&back);
    }
    sf_buf_fini(&b);
    sf_job_fini(&j);
}

/* What sf_rpc_parse accepted (through its fast path or not) is what jansson reads: the
 * same id and method, and params only when there are some. */
static void same_as_jansson(const uint8_t *data, size_t size, int rc, const sf_rpc_msg *m)
{
    json_t *ref = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);

    if (!ref) {
        if (rc != SF_RPC_PARSE_ERROR)
            abort();
        return;
    }
    if (rc == 0 && m->kind == SF_RPC_REQUEST &&
        (!json_equal(m->id, json_object_get(ref, "id")) ||
         strcmp(m->method, json_string_value(json_object_get(ref, "method"))) != 0 ||
         !m->params != !json_object_get(ref, "params")))
        abort();
    json_decref(ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_rpc_msg m;
    char why[512];
    int rc;

    if (!loaded) {
        if (sf_toolset_load(&tools, SF_SCHEMAS_DIR, why, sizeof(why)) < 0) {
            fprintf(stderr, "cannot load the tool schemas: %s\n", why);
            abort();
        }
        loaded = 1;
    }
    why[0] = '\0';
    rc = sf_rpc_parse((const char *)data, size, &m, why, sizeof(why));
    same_as_jansson(data, size, rc, &m);
    if (rc < 0) {
        if ((rc != SF_RPC_PARSE_ERROR && rc != SF_RPC_INVALID_REQUEST &&
             rc != SF_RPC_INVALID_PARAMS) || !why[0])
            abort();
    } else if (m.kind == SF_RPC_REQUEST && !strcmp(m.method, "tools/call") && m.params) {
        const char *name = json_string_value(json_object_get(m.params, "name"));
        json_t *args = json_object_get(m.params, "arguments");

        if (name && json_is_object(args) && strlen(name) < SF_ID_MAX) {
            why[0] = '\0';
            rc = sf_toolset_validate(&tools, name, args, why, sizeof(why));
            if (rc == 0)
                to_job(name, args);
            else if (!why[0])
                abort();
        }
    } else if (m.kind == SF_RPC_REQUEST && !m.id) {
        abort(); /* a request always has an id to answer */
    }
    sf_rpc_msg_fini(&m);
    return 0;
}

void sf_fuzz_cleanup(void)
{
    sf_toolset_fini(&tools);
    sf_schema_cache_clear();
}
