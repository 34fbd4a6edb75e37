/* http.h: libcurl's multi interface on a libevent loop (non-blocking HTTP for the CLI).
 * The caller configures each easy handle; this module drives it and reports its end.
 * Never call these from inside a libcurl callback (write, header, ...): abort a transfer
 * from there by returning an error from the callback instead. */
#ifndef CLI_HTTP_H
#define CLI_HTTP_H

#include <curl/curl.h>
#include <event2/event.h>

typedef struct cli_http cli_http;

/* done(arg, result): the transfer ended (result CURLE_OK or the error); the easy handle
 * is out of the multi handle by then and belongs to the caller again. */
typedef void (*cli_http_done)(void *arg, CURLcode result);

/* NULL on failure (out of memory, or libcurl could not start). */
cli_http *cli_http_new(struct event_base *base);
/* Aborts what still runs (without done callbacks); the easy handles stay the caller's. */
void cli_http_free(cli_http *h);
/* Starts a transfer. 0, -ENOMEM or -EIO. */
int cli_http_add(cli_http *h, CURL *easy, cli_http_done done, void *arg);
/* Aborts a running transfer without calling its done callback (NULL-safe). */
void cli_http_remove(cli_http *h, CURL *easy);
/* How many transfers run. */
int cli_http_running(const cli_http *h);

#endif
