/* tools.c: the tools/list result, built once from the tool catalogue (and encoded once:
 * tools/list answers splice only the request id into the same text). Every tool declares
 * an outputSchema describing the structuredContent of its results (x-sandfleet.output in its
 * schema file); internal messages (sf.cancel) are not tools and are not listed. */
#include "gateway.h"

#include <stdlib.h>
#include <string.h>

/* The inputSchema clients see: the file without its catalogue-only keys. */
static json_t *input_schema(const json_t *file)
{
    json_t *s = json_deep_copy(file);
    json_object_del(s, "$id");
    json_object_del(s, "$schema");
    json_object_del(s, "title");
    json_object_del(s, "description");
    json_object_del(s, "x-annotations");
    json_object_del(s, "x-sandfleet");
    return s;
}

int gw_tools_load(gw_ctx *ctx, char *why, size_t whylen)
{
    json_t *list;

    if (sf_toolset_load(&ctx->tools, ctx->cfg.schemas_dir, why, whylen) < 0)
        return -1;
    /* No tool runs in the gateway itself yet: a schema that says so is a deployment error. */
    if (sf_toolset_check_handlers(&ctx->tools, SF_RUNS_GATEWAY, NULL, 0, why, whylen) < 0)
        return -1;
    list = json_array();
    for (size_t i = 0; i < ctx->tools.n; i++) {
        const json_t *s = ctx->tools.tools[i].schema;
        json_t *ann = json_object_get(s, "x-annotations");
        json_t *tool;

        if (ctx->tools.tools[i].internal)
            continue;
        tool = json_pack("{s:s, s:O, s:o, s:O}", "name", ctx->tools.tools[i].name, "description",
                         json_object_get(s, "description"), "inputSchema", input_schema(s),
                         "outputSchema", ctx->tools.tools[i].output);
        if (!tool) {
            snprintf(why, whylen, "tool %s: cannot build its tools/list entry",
                     ctx->tools.tools[i].name);
            json_decref(list);
            return -1;
        }
        if (ann) {
            json_object_set(tool, "annotations", ann);
            if (json_object_get(ann, "title"))
                json_object_set(tool, "title", json_object_get(ann, "title"));
        }
        json_array_append_new(list, tool);
    }
    if (ctx->cfg.test_fixtures) {
        json_t *fx = gw_fixtures_list();
        json_array_extend(list, fx);
        json_decref(fx);
    }
    ctx->tools_list = json_pack("{s:o}", "tools", list);
    ctx->tools_list_text = ctx->tools_list ? json_dumps(ctx->tools_list, JSON_COMPACT) : NULL;
    ctx->tools_list_len = ctx->tools_list_text ? strlen(ctx->tools_list_text) : 0;
    if (!ctx->tools_list_text) {
        snprintf(why, whylen, "cannot encode the tool list");
        return -1;
    }
    return 0;
}

void gw_tools_free(gw_ctx *ctx)
{
    sf_toolset_fini(&ctx->tools);
    json_decref(ctx->tools_list);
    ctx->tools_list = NULL;
    free(ctx->tools_list_text);
    ctx->tools_list_text = NULL;
}
