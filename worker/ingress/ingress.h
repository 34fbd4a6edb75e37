/* The worker's preview ingress (issue 22; docs/internals/ingress.md): one TCP listener per
 * host that takes nothing but gateways' hops. A hop is one line,
 *     SFHOP1 <sandbox_id> <port> <epoch> <iat_ms> <nonce16hex> <mac64hex>\n
 * MACed with this host's key (common/sf_pvtoken.h); the ingress checks the line (its form,
 * the time window, the MAC, a nonce not seen in the window), asks the daemon for the
 * sandbox's port (the daemon's own state decides: here, alive, published with that epoch;
 * it resumes a paused sandbox and makes a socket inside the sandbox), connects it, answers
 * `SFHOP1 OK\n` and then pumps bytes both ways (bounded buffers, back-pressure, half-close
 * passed on) until both sides closed; or answers `SFHOP1 ERR <status> <sentence>\n` and
 * closes.
 *
 * Threading: everything runs on the loop thread of cfg.base; callbacks into the daemon
 * come from there, never from inside wk_ingress_new. Nothing here blocks the loop except
 * wk_ingress_netns_socket (a thread made and joined around one socket(2)). */
#ifndef WK_INGRESS_H
#define WK_INGRESS_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct wk_ingress wk_ingress;
typedef struct wk_hop wk_hop; /* one hop: from its line to its close */

/* Where the daemon sends a hop it admitted. */
typedef struct wk_hop_target {
    int fd;                       /* a nonblocking TCP socket, not connected: the ingress
                                     connects it to addr and owns it from now on */
    struct sockaddr_storage addr; /* 127.0.0.1:port as that socket's namespace sees it */
    socklen_t addrlen;
    const char *team;             /* whose traffic it is (the byte counters) */
    int relay;                    /* 1: addr is a relay that takes "<port>\n" first and
                                     answers "OK\n" or "ERR\n" (the qemu guest agent's) */
} wk_hop_target;

typedef struct wk_ingress_cfg {
    struct event_base *base;
    const char *listen;           /* "ip:port" (port 0: any free one) */
    const uint8_t *host_key;      /* 32 bytes: the hop lines' MAC key */
    uint32_t conns_max;           /* hops open at once on this host */
    uint32_t conns_per_sandbox;   /* ...and to one sandbox */
    uint32_t line_timeout_ms;     /* the hop line must arrive this soon after the accept */
    uint32_t open_timeout_ms;     /* the daemon must admit a hop this soon (504 after) */
    uint32_t replay_max;          /* nonces remembered (a hop is refused 503 when full) */
    uint32_t buf_max;             /* bytes held per direction before reading stops */
    /* The local hop (NULL or "": none): a folder made mode 0700 (the worker's own; an
     * existing one must be ours with no group or other bits) holding the unix socket
     * `ingress.sock`, where a gateway on this machine speaks the same line and gets the
     * connected socket into the sandbox (SCM_RIGHTS) instead of a pump; only peers whose
     * uid is ours or root are served. */
    const char *local_dir;
    /* A hop whose line checked out, for sandbox id's port published at epoch: the daemon
     * answers exactly once, with wk_ingress_admit or wk_ingress_refuse, possibly inside
     * this call or much later (a resume); h stays valid until then, even when the client
     * left meanwhile. */
    void (*open)(void *arg, wk_hop *h, const char *id, unsigned port, uint64_t epoch);
    void *arg;
} wk_ingress_cfg;

/* The listener, bound and listening: 0 and *out, or -errno with why. */
int wk_ingress_new(const wk_ingress_cfg *cfg, wk_ingress **out, char *why, size_t whylen);
/* Closes the listener and every hop (the daemon must have answered every open). NULL-safe. */
void wk_ingress_free(wk_ingress *ing);
/* The address it listens on ("127.0.0.1:40123"). */
const char *wk_ingress_addr(const wk_ingress *ing);
/* The local hop's socket path ("" when there is none). */
const char *wk_ingress_local_path(const wk_ingress *ing);
/* Local hops served since the start (a socket passed to a gateway). */
uint64_t wk_ingress_local_hops(const wk_ingress *ing);

/* The daemon's answers to open. admit takes t->fd (closed on any failure). refuse: status
 * as the protocol has them (404, 409, 502, 503, 504), why one sentence (no newline). */
void wk_ingress_admit(wk_hop *h, const wk_hop_target *t);
void wk_ingress_refuse(wk_hop *h, int status, const char *why);

/* Ends the open hops of sandbox id (port 0: all its ports) at once: a port closed, the
 * sandbox killed. */
void wk_ingress_drop(wk_ingress *ing, const char *id, unsigned port);

/* Each sandbox with hops open (admitted or waiting), once. */
void wk_ingress_sandboxes(const wk_ingress *ing, void (*fn)(void *arg, const char *id),
                          void *arg);

/* Counters: hops open now, and bytes moved per team (in: client to sandbox; out: back),
 * counted when a hop ends and as it goes. fn is called once per team. */
uint32_t wk_ingress_open_hops(const wk_ingress *ing);
void wk_ingress_teams(const wk_ingress *ing,
                      void (*fn)(void *arg, const char *team, uint64_t in, uint64_t out),
                      void *arg);

/* A nonblocking TCP socket made inside the network namespace netns (an fd of it), by a
 * thread that enters it for the one socket(2) and ends: the socket keeps its namespace,
 * the worker's threads keep theirs. mark: its SO_MARK (0: none). 0 and *fd, or -errno. */
int wk_ingress_netns_socket(int netns, uint32_t mark, int *fd);

#endif
