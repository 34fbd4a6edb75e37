/* tools.h: the tool catalogue as the gateway serves it (tools.c): the tools/list answer,
 * and the one table of handlers for the tools that run in the gateway itself
 * (x-sandfleet.runs: gateway). Every other tool becomes a job (jobs.c).
 *
 * A gateway tool registers its handler in the file that defines it, with GW_TOOL at file
 * scope; linking the file in is what registers it. At start-up the table is checked
 * against the catalogue like the scheduler's and the worker's (sf_toolset_check_handlers):
 * a catalogue tool with runs: gateway and no handler, or a handler whose tool the
 * catalogue does not declare to run here, stops the gateway with one sentence. tools/call
 * finds the handler by name (gw_tool_find); there is no other way in. */
#ifndef GW_TOOLS_H
#define GW_TOOLS_H

#include "gateway.h"

/* Runs one step of call c (step 0 starts it; later steps come from gw_call_later). It
 * ends the call with gw_call_result, at once or from a later step. */
typedef void (*gw_tool_fn)(mcp_call *c, int step);
typedef struct gw_tool {
    const char *name;
    gw_tool_fn fn;
} gw_tool;

#define GW_TOOLS_MAX 64
/* Adds tools[0..n) to the table (before main; GW_TOOL does it). The table holds at most
 * GW_TOOLS_MAX: more, and gw_tools_load refuses to start, naming the limit. */
void gw_tools_register(const gw_tool *tools, size_t n);
/* GW_TOOL(table): registers a file's `static const gw_tool table[]` when the program
 * starts. */
#define GW_TOOL(table)                                                                     \
    __attribute__((constructor)) static void gw_tool_register_##table(void)              \
    {                                                                                      \
        gw_tools_register(table, sizeof(table) / sizeof((table)[0]));                      \
    }
/* The handler of the gateway tool name, or NULL. */
const gw_tool *gw_tool_find(const char *name);

/* Loads the catalogue (ctx->cfg.schemas_dir), checks the handlers against it, and builds
 * the tools/list answer once. 0, or -1 with why. */
int gw_tools_load(gw_ctx *ctx, char *why, size_t whylen);
void gw_tools_free(gw_ctx *ctx);

#endif
