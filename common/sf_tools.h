/* sf_tools: the tool catalogue, read from schemas/tools/ (one .json per tool). Each file is
 * the one place a tool is declared: the JSON Schema of its arguments, its name (title),
 * description and MCP annotations (x-annotations), and under `x-sandfleet` where it runs
 * and how it travels (schemas/README.md):
 *
 *   "x-sandfleet": {
 *     "runs": "worker",            gateway | scheduler | worker (the sandbox's host)
 *     "sandbox": "existing",       new (the call mints a sandbox id) | existing (the call
 *                                  names one in sandbox_id) | none
 *     "wait": {"arg": "timeout_ms", "default": 60000, "max": 600000},
 *                                  the caller waits this argument's value (clamped) plus the
 *                                  gateway's margin; absent: the gateway's call deadline
 *     "resume": true,              worker: a paused sandbox is resumed before the call runs
 *     "claim_check": ["content"],  string arguments that travel by claim check when large
 *     "output": {...}              the JSON Schema of the result's structuredContent
 *   }
 *
 * The gateway serves the catalogue (tools/list) and validates calls with it; the scheduler
 * validates jobs from batch producers with it and routes them by `runs`; the worker reads
 * `resume` and `claim_check`. Routing and waiting follow from the file: no daemon keeps a
 * list of tools, only a table of handlers for the tools that run there (checked against the
 * catalogue at start-up). */
#ifndef SF_TOOLS_H
#define SF_TOOLS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef enum sf_runs { SF_RUNS_GATEWAY, SF_RUNS_SCHEDULER, SF_RUNS_WORKER } sf_runs;
typedef enum sf_tool_sandbox { SF_SB_NONE, SF_SB_NEW, SF_SB_EXISTING } sf_tool_sandbox;

#define SF_TOOL_CLAIMS_MAX 4

typedef struct sf_tool {
    char *name;
    json_t *schema;          /* the file as loaded */
    sf_runs runs;
    sf_tool_sandbox sandbox;
    int resume;              /* worker: auto-resume a paused sandbox first */
    int internal;            /* not served by tools/list nor callable over MCP (sf.cancel) */
    int answered;            /* internal, yet routed, run and answered like any call: the
                                gateway's own jobs for hosted MCP servers (sf.hosted_*) */
    char *wait_arg;          /* NULL: the gateway's call deadline */
    int64_t wait_default_ms, wait_max_ms;
    char *claims[SF_TOOL_CLAIMS_MAX]; /* argument names that may travel by claim check */
    size_t nclaims;
    json_t *output;          /* outputSchema (an object schema) */
} sf_tool;

typedef struct sf_toolset {
    sf_tool *tools;
    size_t n;
} sf_toolset;

/* The platform's own messages on sf.jobs that look like tool calls but are not tools:
 * runs on the worker, no reply (schemas/envelope.md). */
#define SF_TOOL_CANCEL "sf.cancel"
#define SF_TOOL_TEMPLATE_BUILD "sf.template_build"
#define SF_TOOL_TEMPLATE_DELETE "sf.template_delete"
/* Hosted MCP servers (gateway/hosted.c, worker/hosted.c): the gateway's own jobs, answered:
 * start a session's server, hand it one JSON-RPC message, wait for what it sends alone. */
#define SF_TOOL_HOSTED_START "sf.hosted_start"
#define SF_TOOL_HOSTED_SEND "sf.hosted_send"
#define SF_TOOL_HOSTED_LISTEN "sf.hosted_listen"

/* Loads and checks every *.json in dir (schema keywords and the x-sandfleet block), plus the
 * internal sf.cancel, sf.template_build and sf.template_delete. 0, or -EINVAL with why naming the file and the problem. */
int sf_toolset_load(sf_toolset *set, const char *dir, char *why, size_t whylen);
void sf_toolset_fini(sf_toolset *set);
const sf_tool *sf_toolset_find(const sf_toolset *set, const char *name);
/* sandbox_exec's timeout: timeout_ms, or 60 s when absent or not positive, clamped to
 * 600 s (docs/contract.md). Gateway and worker both use it, so they agree on deadlines. */
#define SF_EXEC_TIMEOUT_DEFAULT_MS 60000
#define SF_EXEC_TIMEOUT_MAX_MS 600000
int64_t sf_exec_timeout_ms(const json_t *args);
/* How long a caller waits for t's answer: the `wait` argument (its default when absent or
 * not positive, clamped to its max) plus margin_ms, or base_ms for tools without `wait`. */
int64_t sf_tool_wait_ms(const sf_tool *t, const json_t *args, int64_t base_ms, int64_t margin_ms);
/* True when arg of t may travel by claim check. */
int sf_tool_claimable(const sf_tool *t, const char *arg);

/* The one answer for a sandbox id that is not the caller's, whether it never existed or
 * belongs to another team (the two must be indistinguishable). Writes into buf. */
const char *sf_msg_no_sandbox(char *buf, size_t n, const char *id);

/* 0; -ENOENT unknown tool; -EINVAL arguments invalid. why gets one actionable sentence. */
int sf_toolset_validate(const sf_toolset *set, const char *name, const json_t *args, char *why,
                        size_t whylen);

/* A daemon's handlers for the tools that run there. Checks, at start-up, that every tool
 * of the catalogue that declares `runs` = where has a handler and that every handler names
 * such a tool: 0, or -EINVAL with why naming the first mismatch. */
typedef struct sf_tool_handler {
    const char *name;
    void (*fn)(void);        /* the daemon's own handler type, cast back by the daemon */
} sf_tool_handler;
int sf_toolset_check_handlers(const sf_toolset *set, sf_runs where, const sf_tool_handler *h,
                              size_t n, char *why, size_t whylen);
/* The handler entry for name in h[0..n), or NULL. */
const sf_tool_handler *sf_tool_handler_find(const sf_tool_handler *h, size_t n, const char *name);

#endif
