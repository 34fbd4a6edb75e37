/* oauth.h: the gateway's OAuth 2.1 authorization server (the MCP authorization spec):
 * protected resource metadata (RFC 9728), authorization server metadata (RFC 8414),
 * dynamic client registration (RFC 7591), authorization code + PKCE S256 only, resource
 * indicators (RFC 8707), short-lived access tokens and rotating refresh tokens (hashed in
 * Redis, bound to the team and to the API key that signed in), revocation (RFC 7009).
 * The sign-in page (oauth_page.c) takes a team API key. */
#ifndef GW_OAUTH_H
#define GW_OAUTH_H

#include "gateway.h"

#define GW_WHY_MISSING_CREDENTIALS                                                            \
    "Authentication required: send a sandfleet API key as Authorization: Bearer sf_live_... "  \
    "(create one with: sandfleet keys create --team NAME), or sign in with OAuth."

/* Adds the /.well-known/... and /oauth/... routes. 0 or -ENOMEM. */
int gw_oauth_routes(gw_ctx *ctx);

/* The URL this gateway is reached at, without a trailing slash ("http://127.0.0.1:8080"):
 * public_url when set, else the request's scheme and Host. */
void gw_oauth_base(gw_ctx *ctx, gw_req *req, char *out, size_t n);
/* The MCP endpoint as a resource indicator: base + "/mcp". */
void gw_oauth_resource(gw_ctx *ctx, gw_req *req, char *out, size_t n);
/* The WWW-Authenticate value of a 401 to req: the OAuth challenge with resource_metadata,
 * and error="invalid_token" plus why as error_description when why is not NULL (a key or
 * token was sent but refused). */
void gw_oauth_challenge(gw_ctx *ctx, gw_req *req, const char *why, char *out, size_t n);
/* For the transports' own 401s (gw_http_server_set_challenge). */
void gw_oauth_challenge_fn(gw_req *req, const char *msg, char *out, size_t n, void *arg);

/* An access token's grant, for auth.c: cb(arg, 200, team, key_hash) when the token is valid
 * for resource, else cb(arg, 401, NULL, why) with a sentence saying why, or 503. */
typedef void (*gw_token_cb)(void *arg, int status, const char *team, const char *detail);
void gw_oauth_token_check(gw_ctx *ctx, const char *token, const char *resource, gw_token_cb cb,
                          void *arg);

/* oauth_page.c: the sign-in page (HTML, no script). client_name and the others are plain
 * text (escaped here); error NULL or a sentence shown above the form. */
char *gw_oauth_page(const char *client_name, const char *redirect_host, const char *csrf,
                    const char *error);
char *gw_oauth_error_page(const char *title, const char *sentence);
/* The headers every page carries (no framing, no caching, no referrer), NULL-terminated
 * name/value pairs; cookie NULL or a Set-Cookie value. The array is the calling thread's,
 * good until its next call. */
const char *const *gw_oauth_page_headers(const char *cookie);

/* A redirect URI a client may register: an absolute https URI, or http on a loopback host
 * (localhost, 127.0.0.1, [::1]; native apps, RFC 8252); either with a plain host (no
 * userinfo, at most a numeric port), no fragment, no spaces or backslashes. 1, or 0 with
 * *why set. (oauth_uri.c) */
#define GW_OAUTH_URI_MAX 2048
int gw_oauth_redirect_uri_ok(const char *uri, const char **why);
/* 1 when a sign-in may come back to requested for the registered redirect URI: the same
 * string, or (RFC 8252 7.3) both plain http on the same loopback host (localhost,
 * 127.0.0.1, [::1]) with the same path and query, on any port. (oauth_uri.c) */
int gw_oauth_redirect_matches(const char *registered, const char *requested);

/* oauth_cimd.c: client ID metadata documents. A client_id that is an https URL names the
 * client's metadata document; gw_cimd_get fetches it (HTTPS only, public addresses only,
 * size- and time-bounded, see oauth_cimd.c) and calls cb exactly once, maybe before it
 * returns: client is the client record (client_id, client_name, redirect_uris; borrowed for
 * the call) or NULL and why a sentence about the client. */
typedef void (*gw_cimd_cb)(void *arg, json_t *client, const char *why);
int gw_cimd_is_url(const char *client_id);
void gw_cimd_get(gw_ctx *ctx, const char *client_id, gw_cimd_cb cb, void *arg);
/* Ends the fetches still running (their callbacks hear "stopping"). */
void gw_cimd_stop(gw_ctx *ctx);
/* The operator's documents (oauth_cimd_dir: one *.json each, at most 256 of 64 KiB): a
 * JSON object client_id URL -> client record (*out; NULL when dir is empty), used by
 * gw_cimd_get instead of fetching (ctx->cimd_local). Their redirect URIs must be on
 * loopback unless any_redirect. -1 and why (one sentence naming the file) when one is
 * unusable. */
int gw_cimd_local_load(const char *dir, int any_redirect, json_t **out, char *why, size_t n);
/* The record table (gw_cimd_local_load's) holds for client_id (a reference), or NULL. A
 * document whose client_id holds "{id}" (one whole path segment) answers every client_id
 * with letters, digits, '-' or '_' (1 to 64) there, the same id put into its redirect
 * URIs (Codex's per-callback https://chatgpt.com/oauth/codex/{id}/client.json). */
json_t *gw_cimd_local_find(json_t *table, const char *client_id);
/* 1 when sa is a public unicast address (not loopback, private, link-local, CGNAT,
 * documentation, multicast or otherwise reserved; IPv4 inside IPv6 judged as IPv4). */
struct sockaddr;
int gw_cimd_addr_public(const struct sockaddr *sa);

#endif
