/* client: the worker's side of the secret-proxy control socket
 * (schemas/secret-proxy-control.md). Blocking: call it off the event loop. */
#ifndef SP_CLIENT_H
#define SP_CLIENT_H

#include <jansson.h>
#include <stddef.h>

/* Sends req (a JSON object) over a fresh connection to the proxy's control socket, with
 * netns_fd attached when >= 0, and waits up to timeout_ms for the reply. 0 and *reply (a
 * new reference; check its "ok") or a negative errno with why. */
int sp_client_call(const char *sock_path, const json_t *req, int netns_fd, int timeout_ms,
                   json_t **reply, char *why, size_t whylen);

#endif
