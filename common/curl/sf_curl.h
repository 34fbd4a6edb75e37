/* sf_curl.h: libcurl's multi interface on a libevent loop (non-blocking HTTP for the CLI's
 * mcp-stdio bridge and the gateway's fetches; the sfcurl library, libcurl linked).
 * The caller configures each easy handle; this module drives it and reports its end.
 * Never call these from inside a libcurl callback (write, header, ...): abort a transfer
 * from there by returning an error from the callback instead. */
#ifndef SF_CURL_H
#define SF_CURL_H

#include <curl/curl.h>
#include <event2/event.h>

typedef struct sf_curl sf_curl;

/* done(arg, result): the transfer ended (result CURLE_OK or the error); the easy handle
 * is out of the multi handle by then and belongs to the caller again. */
typedef void (*sf_curl_done)(void *arg, CURLcode result);

/* NULL on failure (out of memory, or libcurl could not start). */
sf_curl *sf_curl_new(struct event_base *base);
/* Aborts what still runs (without done callbacks); the easy handles stay the caller's. */
void sf_curl_free(sf_curl *h);
/* Starts a transfer. 0, -ENOMEM or -EIO. */
int sf_curl_add(sf_curl *h, CURL *easy, sf_curl_done done, void *arg);
/* Aborts a running transfer without calling its done callback (NULL-safe). */
void sf_curl_remove(sf_curl *h, CURL *easy);
/* How many transfers run. */
int sf_curl_running(const sf_curl *h);

#endif
