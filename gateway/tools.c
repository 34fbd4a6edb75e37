/* tools.c: the tools/list result, built once from the tool catalogue (and encoded once:
 * tools/list answers splice only the request id into the same text), and the table of the
 * gateway's own tools (tools.h). Every tool that becomes a job declares an outputSchema
 * describing the structuredContent of its results (x-sandfleet.output in its schema file,
 * else {"type":"object"}); a gateway tool lists one only when its file declares it.
 * Internal messages (sf.cancel) are not tools and are not listed. */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

/* The inputSchema clients see: the file without its catalogue-only keys ($schema too, which
 * some clients refuse, unless x-sandfleet.list_schema keeps it). */
static json_t *input_schema(const json_t *file)
{
    json_t *s = json_deep_copy(file);
    json_object_del(s, "$id");
    if (!json_is_true(json_object_get(json_object_get(file, "x-sandfleet"), "list_schema")))
        json_object_del(s, "$schema");
    json_object_del(s, "title");
    json_object_del(s, "description");
    json_object_del(s, "x-annotations");
    json_object_del(s, "x-sandfleet");
    return s;
}

/* The process's one table of gateway tools, filled before main (GW_TOOL) and read-only
 * from then on, so every thread reads it without a lock. */
static gw_tool table[GW_TOOLS_MAX];
static size_t ntable, nrefused;

void gw_tools_register(const gw_tool *tools, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ntable == GW_TOOLS_MAX) {
            nrefused++;
            continue;
        }
        table[ntable++] = tools[i];
    }
}

const gw_tool *gw_tool_find(const char *name)
{
    for (size_t i = 0; name && i < ntable; i++)
        if (!strcmp(table[i].name, name))
            return &table[i];
    return NULL;
}

/* The table against the catalogue, as every daemon checks its handlers. */
static int check_handlers(gw_ctx *ctx, char *why, size_t whylen)
{
    sf_tool_handler h[GW_TOOLS_MAX];

    if (nrefused) {
        snprintf(why, whylen, "this gateway has %zu gateway tools, more than the %d it can "
                 "hold; raise GW_TOOLS_MAX in gateway/tools.h", ntable + nrefused, GW_TOOLS_MAX);
        return -1;
    }
    for (size_t i = 0; i < ntable; i++)
        h[i] = (sf_tool_handler){table[i].name, (void (*)(void))table[i].fn};
    return sf_toolset_check_handlers(&ctx->tools, SF_RUNS_GATEWAY, h, ntable, why, whylen) < 0
               ? -1 : 0;
}

int gw_tools_load(gw_ctx *ctx, char *why, size_t whylen)
{
    json_t *list;

    if (sf_toolset_load(&ctx->tools, ctx->cfg.schemas_dir, why, whylen) < 0)
        return -1;
    if (check_handlers(ctx, why, whylen) < 0)
        return -1;
    list = json_array();
    for (size_t i = 0; i < ctx->tools.n; i++) {
        const json_t *s = ctx->tools.tools[i].schema;
        json_t *ann = json_object_get(s, "x-annotations");
        json_t *tool;

        if (ctx->tools.tools[i].internal)
            continue;
        tool = json_pack("{s:s, s:O, s:o}", "name", ctx->tools.tools[i].name, "description",
                         json_object_get(s, "description"), "inputSchema", input_schema(s));
        if (tool && (ctx->tools.tools[i].runs != SF_RUNS_GATEWAY ||
                     json_object_get(json_object_get(s, "x-sandfleet"), "output")))
            json_object_set(tool, "outputSchema", ctx->tools.tools[i].output);
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
