/* gwcall: the CLI as an MCP client of the gateway, as the team of $SANDFLEET_API_KEY
 * (`templates`, `servers`): initialize, tools/call, and plain HTTP requests to the gateway's
 * own API beside /mcp. Answers are held in memory, at most 4 MiB. */
#ifndef CLI_GWCALL_H
#define CLI_GWCALL_H

#include <curl/curl.h>
#include <jansson.h>

typedef struct cli_gw {
    CURL *easy;
    char url[1024];  /* the MCP endpoint ($SANDFLEET_URL, else SF_URL) */
    char base[1024]; /* the gateway's root: url without its /mcp */
    char auth[600];
    char session[256];
    char *buf;       /* the last answer's body (NUL-terminated), or NULL */
    size_t len;
    long timeout_s;  /* of one request; 120 unless the caller sets more after open */
    char err[512];   /* the last failed call's sentence ("" after a success) */
} cli_gw;

/* Reads the key and URL; with need_session also initializes an MCP session. 0, or 1 after
 * printing why. cli_gw_close either way. */
int cli_gw_open(cli_gw *m, int need_session);
void cli_gw_close(cli_gw *m);
/* One HTTP request to url (body NULL: none; is_mcp adds the session's headers); *status its
 * HTTP status, the body in m->buf. 0, or 1 after printing why it could not be sent (or
 * that the key was refused). */
int cli_gw_http(cli_gw *m, const char *method, const char *url, const char *body, int is_mcp,
                long *status);
/* tools/call of tool with args (stolen); *structured (may be NULL) gets structuredContent.
 * 0, or 1 (the error's sentence printed unless quiet, and kept in m->err). */
int cli_gw_call(cli_gw *m, const char *tool, json_t *args, json_t **structured, int quiet);
/* Polls sandbox_template_list until template name is no longer building (a progress bar on
 * stderr when show). 0 when ready, 1 when it failed (its error printed) or vanished. */
int cli_gw_template_wait(cli_gw *m, const char *name, int show);

#endif
