/* common/sf_msg.h: the platform's user-facing sentences that more than one place writes,
 * each written once (docs/internals/messages.md). A caller passes the name where it passed
 * the literal. A name ending in _FMT is a printf format (its section says what the
 * conversions stand for), used directly as the format string so that -Wformat still checks
 * the arguments. A name ending in _WHY is a lower-case reason that other text wraps.
 * A sentence only one place writes stays in that place; tests/lint/messages.sh fails when a
 * sentence is written twice. Changing a sentence here changes what users read: grep tests/
 * for it first. */
#ifndef SF_MSG_H
#define SF_MSG_H

/* A write the state store refused because it is full (sf_redis_is_oom). */
#define SF_MSG_PLATFORM_FULL                                                                   \
    "The platform is full (its state store reached its memory limit); kill sandboxes you "    \
    "no longer need and retry, or ask the operator to raise the Redis maxmemory."

/* The platform's state */
#define SF_MSG_STORE_DOWN "The platform's state store is unreachable; retry in a few seconds."
#define SF_MSG_STORE_DOWN_NOTHING_CHANGED                                                          \
    "The platform's state store is unreachable; nothing changed. Retry in a few seconds."
#define SF_MSG_STORE_DOWN_AFTER_CHANGE                                                             \
    "The change was made, but the platform's state store is unreachable to show it; see "          \
    "sandbox_info in a few seconds."
#define SF_MSG_STORE_DOWN_LARGE_ARGS                                                               \
    "The platform's state store is unreachable, so the large arguments could not be handed "       \
    "over; retry in a few seconds."

/* Out of memory or descriptors (sentences; *_WHY: lower-case reasons other text wraps) */
#define SF_MSG_OOM_JSON "{\"error\":\"Out of memory; retry.\"}" /* an HTTP answer's body */
#define SF_MSG_ENV_TOO_MANY "Too many environment variables; pass at most 256."
#define SF_MSG_HOST_NOMEM "The host is out of memory; retry later."
#define SF_MSG_HOST_NOMEM_BUILD "The host is out of memory; build it again."
#define SF_MSG_SCHED_NOMEM "The scheduler is out of memory; retry later."
#define SF_MSG_SERVER_NOMEM "The server is out of memory; retry."
#define SF_MSG_SERVER_NOMEM_WHY "the server is out of memory; retry later"
#define SF_MSG_PROXY_NOMEM "The proxy is out of memory."
#define SF_MSG_PROXY_NOMEM_WHY "the proxy is out of memory"
#define SF_MSG_WORKER_NOFD "The worker is out of file descriptors; raise its limit (ulimit -n)."

/* Hosts */
#define SF_MSG_HOST_STOPPING "This host is shutting down; retry in a few seconds."
#define SF_MSG_HOST_AT_CAPACITY                                                                    \
    "The chosen host is at capacity; retry sandbox_create in a few seconds."
/* %s: what ran out (sandboxes, memory, cpu, disk) */
#define SF_MSG_HOST_NO_ROOM_FMT                                                                    \
    "The chosen host has no %s left for this sandbox; retry sandbox_create in a few seconds, "    \
    "kill a sandbox, or ask for a smaller shape in limits."
#define SF_MSG_HOST_RANDOM_NOT_READY "The host's random generator is not ready; retry in a moment."

/* Sandboxes (%s: the sandbox id) */
#define SF_MSG_SANDBOX_KILLED_FMT "Sandbox '%s' was killed; create a new one with sandbox_create."
#define SF_MSG_SANDBOX_KILLED_MEANWHILE_FMT                                                        \
    "Sandbox '%s' was killed meanwhile; create a new one with sandbox_create."
#define SF_MSG_SANDBOX_KILLED_DURING_CALL_FMT                                                      \
    "Sandbox '%s' was killed during the call; create a new one with sandbox_create."
#define SF_MSG_SANDBOX_FAILED_FMT                                                                  \
    "Sandbox '%s' failed to start; create a new one with sandbox_create."
#define SF_MSG_KILLED_DURING_SNAPSHOT "The sandbox was killed while its snapshot was taken."
#define SF_MSG_KILLED_DURING_EXEC "The sandbox was killed while the command ran."
#define SF_MSG_RESUME_FAILED                                                                       \
    "The paused sandbox could not be resumed; retry, or kill it and create a new one."
#define SF_MSG_SNAPSHOT_FILES_MISSING                                                              \
    "The snapshot's files are missing on its host; delete it and take a new one."
#define SF_MSG_AGENT_EXITED "The sandbox's agent exited right after starting; check agent_path."
#define SF_MSG_AGENT_GARBAGE                                                                       \
    "The sandbox's agent answered the ping with garbage; rebuild sandfleet-agent."
#define SF_MSG_VM_SLOW_START                                                                       \
    "The sandbox's VM did not come up in time; the host may be overloaded: retry "                 \
    "sandbox_create."
#define SF_MSG_VM_SETUP_QUEUE_WHY "cannot queue the setup command"

/* Calls and their arguments (%lld: MiB; %.64s: the tool's name) */
#define SF_MSG_TOO_MANY_CALLS                                                                      \
    "Too many calls are running in this sandbox; wait for some to finish, then retry."
#define SF_MSG_CALL_EXPIRED "The call waited in the queue past its deadline; retry it."
#define SF_MSG_ARGS_TOO_LARGE                                                                      \
    "The arguments are too large for one call (over 1 MiB encoded); put large inputs in a "        \
    "file in the sandbox first, in smaller calls."
#define SF_MSG_TEAM_FILES_FULL_FMT                                                                 \
    "Your team's large uploads and answers in flight already hold %lld MiB, its limit; wait "      \
    "for other file calls to finish, then retry."
#define SF_MSG_UNKNOWN_TOOL_FMT "Unknown tool '%.64s'; call tools/list to see the tools."
#define SF_MSG_ARG_SANDBOX_ID "Argument 'sandbox_id' is required."

/* Templates (%s: what went wrong) */
#define SF_MSG_TPL_FILES "Cannot write the template's files; check state_dir."
#define SF_MSG_TPL_READY_MARK "Cannot write the template's ready mark."
#define SF_MSG_TPL_BUILD_START_FMT "The build sandbox could not start (%s); build it again."
#define SF_MSG_TPL_STORE_FMT "The host could not store the built template (%s); build it again."
#define SF_MSG_TPL_START_CMD_FMT "start_cmd could not be started (%s)"
#define SF_MSG_TPL_TIMED_OUT_WHY " (timed out after 10 minutes)"

/* Settings and tool schemas (%s: the URL; %d: the depth limit) */
#define SF_MSG_STATE_DIR_LONG "The worker's state_dir is too long; use a shorter path."
#define SF_MSG_STATE_DIR_BAD "state_dir must be an absolute path of at most 1024 bytes."
#define SF_MSG_VM_DIR_LONG "vm_dir is too long; use a shorter path."
#define SF_MSG_VM_TEMPLATES_LOCK                                                                   \
    "Cannot create or lock vm_dir/templates; check that vm_dir is writable."
#define SF_MSG_HOST_ID_BAD "host_id must match [a-z0-9_-]{1,63}."
#define SF_MSG_CFG_SCHEMAS_DIR "folder of the tool JSON Schemas"
#define SF_MSG_REDIS_URL_BAD_FMT "Redis URL '%s' is not redis://HOST:PORT or unix:/PATH."
#define SF_MSG_SCHEMA_TOO_DEEP_FMT "is nested too deeply (the limit is %d levels)."
#define SF_MSG_SCHEMA_REQUIRED_ARRAY "'required' must be an array of property names."

/* The gateway (HTTP, sign-in) */
#define SF_MSG_HTTP_BUSY "The server is busy with other large requests; retry in a moment."
#define SF_MSG_HTTP_HEADERS_TOO_LARGE_WHY "request headers too large"
#define SF_MSG_HTTP_STATE_ORDER_WHY "internal error: request state out of order"
#define SF_MSG_H2_NO_METHOD_PATH_WHY "malformed HTTP/2 request: :method and :path are required"
#define SF_MSG_TOKEN_UNKNOWN "The access token is unknown or was revoked; sign in again."
#define SF_MSG_CIMD_FETCH_FAILED                                                                   \
    "The server could not start fetching its client metadata document; retry."

/* The secret-proxy and secrets (%s: a sandbox id, a team, a secret name) */
#define SF_MSG_PROXY_HEAD_TOO_LARGE_WHY "the request head is larger than 32 KiB"
#define SF_MSG_PROXY_SB_REGISTERED_FMT                                                             \
    "Sandbox %s is already registered; unregister it first or send update."
#define SF_MSG_PROXY_SB_UNKNOWN_FMT "Sandbox %s is not registered with this proxy."
#define SF_MSG_SECRET_UNKNOWN_FMT "Team %s has no secret named %s; see `sandfleet secrets list`."

/* The sandfleet command (stderr lines; %s: a file, grant or client name, then why) */
#define SF_MSG_CLI_NOMEM "sandfleet: out of memory.\n"
#define SF_MSG_CLI_CANNOT_OPEN_FMT "sandfleet: cannot open %s: %s.\n"
#define SF_MSG_CLI_NO_GRANT_FMT "sandfleet: no grant %s; see: sandfleet tokens list\n"
#define SF_MSG_CLI_ENTRY_SAME_FMT "%s already holds this sandfleet entry; nothing to change.\n"
#define SF_MSG_CLI_ENTRY_DONE_FMT "%s sandfleet in %s (everything else there is kept).\n"

/* The CLI's commands that act through the gateway as a team (templates, servers) */
#define SF_MSG_CLI_GATEWAY_UNREACHABLE_FMT /* URL, curl's reason */                                \
    "Cannot reach the sandfleet gateway at %s (%s); start it (ops/run) or set SANDFLEET_URL, "  \
    "then retry.\n"
#define SF_MSG_CLI_KEY_REFUSED_FMT /* HTTP status */                                               \
    "The gateway refused the API key (HTTP %ld); check SANDFLEET_API_KEY.\n"
#define SF_MSG_CLI_NO_RESULT_FMT /* HTTP status */                                                 \
    "The gateway answered HTTP %ld without a usable result; retry.\n"
#define SF_MSG_CLI_KEY_UNSET                                                                       \
    "SANDFLEET_API_KEY is not set: export your team's key (sandfleet keys create --team NAME "  \
    "prints one).\n"
#define SF_MSG_CLI_KEY_TOO_LONG "SANDFLEET_API_KEY is too long to be a sandfleet key.\n"

/* A worker restart (docs/internals/restart.md): why a sandbox was not taken back. */
#define SF_MSG_ADOPT_NO_HANDLE \
    "Its host-side handle is missing (the worker stopped while it was created)."
#define SF_MSG_ADOPT_BAD_HANDLE "Its host-side handle is not root's or damaged."
#define SF_MSG_ADOPT_BAD_ID "The sandbox id is not valid."
#define SF_MSG_ADOPT_TWICE "The sandbox was taken back already."

#endif
