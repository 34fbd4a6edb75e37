/* tools.c: the tools/list result, built once from the tool catalogue. */
#include "gateway.h"

/* The inputSchema clients see: the file without its catalogue-only keys. */
static json_t *input_schema(const json_t *file)
{
    json_t *s = json_deep_copy(file);
    json_object_del(s, "$id");
    json_object_del(s, "$schema");
    json_object_del(s, "title");
    json_object_del(s, "description");
    json_object_del(s, "x-annotations");
    return s;
}

int gw_tools_load(gw_ctx *ctx, char *why, size_t whylen)
{
    json_t *list;

    if (sf_toolset_load(&ctx->tools, ctx->cfg.schemas_dir, why, whylen) < 0)
        return -1;
    list = json_array();
    for (size_t i = 0; i < ctx->tools.n; i++) {
        const json_t *s = ctx->tools.tools[i].schema;
        json_t *ann = json_object_get(s, "x-annotations");
        json_t *tool = json_pack("{s:s, s:O, s:o}", "name", ctx->tools.tools[i].name,
                                 "description", json_object_get(s, "description"), "inputSchema",
                                 input_schema(s));
        if (ann) {
            json_object_set(tool, "annotations", ann);
            if (json_object_get(ann, "title"))
                json_object_set(tool, "title", json_object_get(ann, "title"));
        }
        json_array_append_new(list, tool);
    }
    ctx->tools_list = json_pack("{s:o}", "tools", list);
    return ctx->tools_list ? 0 : -1;
}

void gw_tools_free(gw_ctx *ctx)
{
    sf_toolset_fini(&ctx->tools);
    json_decref(ctx->tools_list);
    ctx->tools_list = NULL;
}
