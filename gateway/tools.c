/* tools.c: the tool catalogue, read from schemas/tools/*.json at start-up. Each file
 * is the JSON Schema of one tool's arguments, with its name (title), description and
 * MCP annotations (x-annotations). */
#include "gateway.h"
#include "sf_schema.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_MAX 64

static int json_file(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return n > 5 && !strcmp(d->d_name + n - 5, ".json");
}

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
    struct dirent **ents = NULL;
    json_t *list = json_array();
    int n = scandir(ctx->cfg.schemas_dir, &ents, json_file, alphasort), rc = -1;

    if (n < 0) {
        snprintf(why, whylen, "Cannot read the tool schemas in %s; set schemas_dir.",
                 ctx->cfg.schemas_dir);
        goto out;
    }
    if (n == 0 || n > TOOLS_MAX || !(ctx->tools = calloc((size_t)n, sizeof(gw_tool)))) {
        snprintf(why, whylen, "%s must hold 1 to %d tool schemas.", ctx->cfg.schemas_dir,
                 TOOLS_MAX);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char path[4096], swhy[256];
        json_error_t jerr;
        json_t *s, *tool;
        const char *name;

        snprintf(path, sizeof(path), "%s/%s", ctx->cfg.schemas_dir, ents[i]->d_name);
        if (!(s = json_load_file(path, 0, &jerr))) {
            snprintf(why, whylen, "%s:%d: %s", path, jerr.line, jerr.text);
            goto out;
        }
        name = json_string_value(json_object_get(s, "title"));
        if (!name || sf_schema_check(s, swhy, sizeof(swhy)) < 0) {
            snprintf(why, whylen, "%s: %s", path, name ? swhy : "'title' (the tool name) is missing");
            json_decref(s);
            goto out;
        }
        ctx->tools[ctx->ntools].name = strdup(name);
        ctx->tools[ctx->ntools].schema = s;
        ctx->ntools++;
        tool = json_pack("{s:s, s:O, s:o}", "name", name, "description",
                         json_object_get(s, "description"), "inputSchema", input_schema(s));
        if (json_object_get(s, "x-annotations")) {
            json_object_set(tool, "annotations", json_object_get(s, "x-annotations"));
            json_object_set(tool, "title",
                            json_object_get(json_object_get(s, "x-annotations"), "title"));
        }
        json_array_append_new(list, tool);
    }
    ctx->tools_list = json_pack("{s:O}", "tools", list);
    rc = ctx->tools_list ? 0 : -1;
out:
    for (int i = 0; i < n; i++)
        free(ents[i]);
    free(ents);
    json_decref(list);
    return rc;
}

void gw_tools_free(gw_ctx *ctx)
{
    for (size_t i = 0; i < ctx->ntools; i++) {
        free(ctx->tools[i].name);
        json_decref(ctx->tools[i].schema);
    }
    free(ctx->tools);
    json_decref(ctx->tools_list);
    ctx->tools = NULL;
    ctx->tools_list = NULL;
    ctx->ntools = 0;
}

const gw_tool *gw_tools_find(const gw_ctx *ctx, const char *name)
{
    for (size_t i = 0; i < ctx->ntools; i++)
        if (!strcmp(ctx->tools[i].name, name))
            return &ctx->tools[i];
    return NULL;
}
