/* The worker: one per host. Consumes its host topic, runs each job against its
 * isolation driver (driver.h), answers on the caller's reply topic, heartbeats its
 * capacity. */
#ifndef WK_WORKER_H
#define WK_WORKER_H

#include "driver.h"
#include "pool.h"
#include "sf_call.h"
#include "sf_codec.h"
#include "sf_daemon.h"
#include "sf_jobio.h"
#include "sf_map.h"
#include "sf_redis.h"
#include "sf_tools.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct wk_cfg {
    sf_common_cfg common;
    char *host_id;          /* "" = derived from the hostname */
    char *host_key_file;    /* this host's key for the scheduler's jobs (hostauth.c) */
    char *auth_secret_file; /* ...or derived from the auth secret when no host_key_file */
    char *state_dir;
    char *agent_path;
    char *driver;           /* "jail" */
    char *schemas_dir;      /* the tool schemas (what runs here, and how) */
    char *proxy_control_socket; /* the secret-proxy's ("" = egress off) */
    int64_t capacity;       /* sandboxes this host runs at most (also bounded by resources) */
    int64_t memory_mib;     /* per sandbox, when the scheduler sends no limits */
    int64_t vcpu_milli;
    int64_t disk_mib;
    int64_t inodes;
    int64_t pids_max;
    int64_t nofile;
    int64_t heartbeat_ms;
    int64_t uid_base;
    int64_t host_share_pct;
    int64_t reserve_mem_mib;
    int64_t reserve_vcpu_milli;
    int64_t cpu_overcommit_pct;
    int64_t disk_overcommit_pct;
    int64_t pool_images;
    int64_t pool_threads;
    int teardown_stop;
    char *templates_dir;    /* built-in templates shared by this host's workers (tstore.h) */
    char *vm_dir;           /* qemu */
    int64_t vm_save_after_ms;
    int64_t vm_pool;
    int64_t claim_team_mib; /* a team's large answers in Redis at once (claim checks) */
    int64_t guard_team_mib; /* a team's answers kept for repeats (job guards) at once */
    int64_t job_deadline_max_ms; /* a producer's deadline is capped at arrival + this */
    int64_t zips;           /* downloads (ZIPs) built at once on this host */
    int64_t idle_pause_ms;  /* a running sandbox without calls this long is paused (0 = never) */
    int64_t lifetime_s;     /* the platform's default lifetime (no timeout_seconds given) */
    int64_t timer_tick_ms;  /* how often this host's due timers are read from Redis */
    int64_t snapshots_per_team; /* snapshots one team may hold (snapshot.c) */
    int64_t snapshot_team_mib;  /* ...and MiB they may hold together */
    int64_t snapshot_sweep_ms;  /* how often files of deleted snapshots are looked for */
    char *ingress_listen;       /* preview.c: the preview ingress's address (ip:port) */
    char *preview_domain;       /* ...and the URLs it hands out (common/sf_pvtoken.h) */
    char *preview_scheme;
    int64_t ingress_conns;      /* preview connections open at once on this host */
    int64_t ingress_conns_per_sandbox; /* ...and to one sandbox */
    int64_t ingress_local;      /* 1: the local hop (state_dir/ingress/ingress.sock) */
    int64_t exec_detach_ms;     /* exec.c: still running then, a command answers and goes
                                   on in the background (0 = never) */
} wk_cfg;

/* What the heartbeat thread publishes; written by the loop thread. */
typedef struct wk_beat {
    atomic_int running;     /* sandboxes holding resources: starting, running, being killed */
    atomic_int stop;
    atomic_ullong disk_mib, disk_used_mib; /* offered; held by sandboxes and snapshots */
} wk_beat;

typedef struct wk_ctx {
    sf_daemon d;
    wk_cfg cfg;
    char host_id[SF_ID_MAX];
    char topic[SF_TOPIC_MAX];
    uint8_t host_key[32];   /* checks the scheduler's signature on each job (hostauth.c) */
    const wk_driver_ops *ops;
    wk_driver *drv;
    wk_pool *pool;
    wk_host_res res;
    int64_t capacity;       /* effective: cfg, driver slots and resources */
    uint64_t used_mem_mib, used_vcpu_milli, used_disk_mib; /* held by the boxes */
    uint64_t snap_disk_mib; /* held by the snapshots stored here (snapshot.c) */
    sf_redis *redis;
    rd_kafka_t *producer, *consumer;
    sf_jobq *jobq;
    sf_map *sandboxes;      /* id -> wk_box, from create until the teardown ended */
    sf_map *running;        /* job id -> wk_call of the execs running (sf.cancel finds them) */
    sf_toolset tools;       /* the tool catalogue */
    struct wk_egress *egress; /* the link to this host's secret-proxy (egress.h) */
    struct wk_tstore *tstore; /* this host's templates (tstore.h) */
    struct event *ev_check; /* asks Redis which sandboxes the platform still knows */
    pthread_t beat_thread;
    int beat_started;
    wk_beat beat;
    int stopping;           /* new jobs are refused */
    int draining;           /* host.c: `sandfleet hosts drain`: no capacity, sandboxes killed */
    int zips_running;       /* sandbox_files_download_dir calls under way */
    struct event *ev_timers; /* life.c: reads the due timers */
    int timers_asking;      /* ...one read at a time */
    struct wk_ingress *ingress; /* preview.c: the preview ingress (ingress/ingress.h) */
    char ingress_addr[64];  /* ...its address, for the heartbeat (set before it starts) */
    char ingress_local[256]; /* ...its local hop's socket ("": none), and this machine's */
    char boot_id[40];        /* boot id (gateways on the same boot take the local hop) */
    uint64_t pv_epoch_last; /* the last preview epoch handed out */
} wk_ctx;

enum { WK_BOX_CREATING, WK_BOX_RUNNING, WK_BOX_KILLING };
#define WK_PV_MAX 16 /* preview ports published per sandbox at once */

/* One job being handled on this host; ends with exactly one reply (or none for the
 * internal sf.cancel) through wk_reply_*. */
typedef struct wk_call {
    wk_ctx *ctx;
    sf_job job;
    sf_call call;           /* its answer and offset (common/sf_call.h), shared with the scheduler */
    const sf_tool *tool;
    int claims_left;        /* argument claims still being taken from Redis */
    int claims_failed;      /* ...of which one could not be */
    int on_box;             /* counted in its box's calls */
    int cancelled;          /* an sf.cancel named it: its final reply is `cancelled` */
    void (*run)(struct wk_call *c); /* what runs it once its guard and claims let it (call.c) */
} wk_call;

/* A sandbox this host holds, with what the worker keeps beside the driver's handle. */
typedef struct wk_box {
    wk_ctx *ctx;
    wk_sandbox *sb;         /* NULL while creating */
    int state;              /* WK_BOX_* */
    char id[SF_ID_MAX];
    char team[SF_ID_MAX];
    wk_limits lim;          /* what it holds of the host */
    json_t *env;            /* env_vars given at create (object of strings) */
    struct wk_egbox *eg;    /* its egress (egress.h), NULL when egress is off */
    wk_call *create;        /* the create job, until the driver answered */
    int64_t last_active_ms; /* monotonic: the last call that used it */
    int64_t touched_ms;     /* monotonic: when wk_touch last wrote last_active to Redis */
    int calls;              /* calls running on it now (no idle pause meanwhile) */
    int paused;             /* 1: paused (frozen) */
    int pausing;            /* 1: a pause is under way */
    const char *end_state;  /* record state once torn down: killed, lost, failed */
    char template_name[64]; /* the template it started from (its snapshots' too) */
    char snap_used[SF_ID_MAX]; /* created from this snapshot: in use until the driver answered */
    int64_t computer_tat_ms; /* sandbox_computer's rate limit (computer.c): monotonic ms */
    int pv_private;         /* preview_access of ports published from now on (preview.c) */
    struct wk_pvport {      /* its published preview ports */
        uint16_t port;
        uint8_t priv;       /* 1: private (links), 0: public */
        uint64_t epoch;     /* this publication's, in every hop and link */
    } pv[WK_PV_MAX];
    int pv_n;
    int kept;               /* restart.c: left running at a stop, for the next worker */
} wk_box;

/* drivers.c: the driver compiled in under that name, or NULL; "jail, qemu": the names it
 * knows, for messages. */
const wk_driver_ops *wk_driver_find(const char *name);
const char *wk_driver_names(void);

/* call.c: the call module every handler uses; it calls none of them. */
/* The one reply of c, which ends it. wk_reply_result steals result; string fields of at
 * least SF_CLAIM_MIN bytes travel by claim check. */
void wk_reply_error(wk_call *c, const char *code, const char *message);
void wk_reply_result(wk_call *c, json_t *result);
/* Ends c without a reply (internal jobs, repeats of a running one). */
void wk_call_done(wk_call *c);
/* Answers c without running it; a create that never ran leaves no record behind. */
void wk_call_refuse(wk_call *c, const char *code, const char *message);
/* c is not signed by the scheduler for this host: dead-lettered and answered
 * `unauthenticated` (an internal one never is). */
void wk_call_refuse_forged(wk_call *c, const char *text);
/* The job guard, then the call's argument claims; run(c) once both let it run. A repeat
 * gets its first answer, a job past its deadline or over the team's budget an error. */
void wk_call_begin(wk_call *c, void (*run)(wk_call *c));
/* The record of sandbox id goes to state (only_live: only from a live state); logged. */
void wk_record_retire(wk_ctx *ctx, const char *id, const char *state, int only_live);

/* The tool handlers. A handler gets the call and the sandbox: running for tools on an
 * existing sandbox (except sandbox_kill, which also gets sandboxes being created or killed,
 * and NULL); NULL for the others. A handler file registers its tools where it defines them:
 *     WK_HANDLERS({"sandbox_exec", do_exec});
 * (a constructor adds them to call.c's registry before main; wk_jobs_check then holds them
 * against the tool catalogue). */
typedef void (*wk_handler_fn)(wk_call *c, wk_box *b);
typedef struct wk_handler {
    const char *tool;
    wk_handler_fn fn;
} wk_handler;
#define WK_HANDLERS_MAX 64
void wk_handlers_add(const wk_handler *h, size_t n);
/* The registered handlers (NULL when more than WK_HANDLERS_MAX were), and one by tool. */
const sf_tool_handler *wk_handlers(size_t *n);
wk_handler_fn wk_handler_find(const char *tool);
#define WK_HANDLERS(...)                                                                      \
    static const wk_handler wk_handlers_here[] = {__VA_ARGS__};                               \
    __attribute__((constructor)) static void wk_handlers_register(void)                       \
    {                                                                                         \
        wk_handlers_add(wk_handlers_here, sizeof(wk_handlers_here) / sizeof(wk_handler));     \
    }

/* box.c: the sandboxes this host holds. */
/* Answers a call for a sandbox this worker does not hold with what its record says. */
void wk_box_not_here(wk_call *c);
/* Forgets b and gives back what it held of the host. */
void wk_box_release(wk_box *b);

/* dispatch.c: 0 when this worker handles exactly the tools the catalogue declares to run on
 * a host; a job of the host topic. */
int wk_jobs_check(const sf_toolset *tools, char *why, size_t whylen);
void wk_on_job(void *arg, sf_job *job, sf_kafka_ticket tk);
/* hostauth.c: this host's key (0, or -1 with why); 0 when job carries the scheduler's fresh
 * signature for this host, else -1 with a sentence in text. */
int wk_hostauth_init(wk_ctx *ctx, char *why, size_t whylen);
int wk_hostauth_check(const wk_ctx *ctx, const sf_job *job, char *text, size_t n);
void wk_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why);
/* Starts the kill of a sandbox (any state); the record becomes end_state when the
 * teardown ended. */
void wk_box_kill(wk_box *b, const char *end_state);
/* The same; written(ac, reply, priv) runs once the record says `killing` (or its write
 * failed). 0, or < 0 when written will not run: -EALREADY (being killed already), or
 * Redis is down. */
int wk_box_kill_then(wk_box *b, const char *end_state, redisCallbackFn *written, void *priv);
/* A lifecycle event on sf.events (common/sf_events.h); a failure is logged. */
void wk_event(wk_ctx *ctx, const char *type, const char *team, const char *sandbox,
              const json_t *extra);
void wk_redis_logged(redisAsyncContext *ac, void *r, void *priv);

/* files.c: n bytes at p as a JSON string of standard base64 (file contents, screenshots);
 * NULL when out of memory. */
json_t *wk_json_base64(const char *p, size_t n);

/* life.c: pause, resume and the lifecycle timers (state/sf_timers.h). */
/* Pauses / resumes b; done(c, rc, why) once it is (possibly inside the call; c may be
 * NULL, done too for wk_box_pause). -errno when the driver refused at once (done not
 * called). A resume also ends a pause under way. */
int wk_box_pause(wk_box *b, wk_call *c, void (*done)(wk_call *c, int rc, const char *why));
int wk_box_resume(wk_box *b, wk_call *c, void (*done)(wk_call *c, int rc, const char *why));
/* The same for callers that are no call (a preview hop): done(arg, rc, why). */
int wk_box_resume_for(wk_box *b, void (*done)(void *arg, int rc, const char *why), void *arg);
/* b started (args: the create's): its lifetime, idle and auto-delete timers. */
void wk_life_started(wk_box *b, const json_t *args);
/* A call used sandbox id: its last activity is now (here, and in its record), and its idle
 * timer starts again. */
void wk_touch(wk_ctx *ctx, const char *id);
int wk_life_start(wk_ctx *ctx);
void wk_life_stop(wk_ctx *ctx);

/* tpl_build.c: builds the team template job describes (sf.template_build); removes a
 * deleted one's files (sf.template_delete). No reply. */
void wk_tpl_build(wk_ctx *ctx, const sf_job *job);
/* At shutdown, first: each build still running here is recorded failed on this host
 * ("Host h was stopped while it built this template; ..."), since a host that leaves
 * cleanly is never reaped; the builds write nothing after it. */
void wk_tpl_build_stop_all(wk_ctx *ctx);
/* At start, on a blocking connection: the builds this host's previous run left `building`
 * (it died) are failed here ("Host h restarted while it built ..."). 0 or -EIO. */
int wk_tpl_build_reconcile_sync(wk_ctx *ctx, redisContext *c);
/* At exit, once the driver and the pool are gone: the builds cut short by the shutdown
 * are freed (their sandboxes went with the driver). */
void wk_tpl_build_free_all(void);
void wk_tpl_delete(wk_ctx *ctx, const sf_job *job);

/* snapshot.c: sandbox_snapshot (handler), the files of a create's from_snapshot (use:
 * their directory into dir, -errno + why; unuse once the driver answered), and the
 * removal of files whose record is gone (start: at once when Redis answers, then every
 * snapshot_sweep_ms). */
int wk_snap_use(wk_ctx *ctx, const char *id, char *dir, size_t n, const char **why);
void wk_snap_unuse(wk_ctx *ctx, const char *id);
int wk_snap_start(wk_ctx *ctx);
void wk_snap_stop(wk_ctx *ctx);

/* preview.c: sandbox_preview_url (handler); sandbox_create's and sandbox_update's preview
 * fields; the preview ingress (ingress/ingress.h) that gateways hop to. */
/* preview_access of a create's or update's args into b: 0, or -1 (not given). */
int wk_preview_access_arg(wk_box *b, const json_t *args);
/* sandbox_update's preview_access and preview_close: the record, then done(c) (or an
 * error reply). */
void wk_preview_update(wk_call *c, wk_box *b, void (*done)(wk_call *c));
/* Publishes port of b as sandbox_preview_url does (the sandbox's mode; a private link good
 * for exp_in s), for another tool (sandbox_computer's stream_url): done(c, url, token,
 * exp) once the record says so, with the port's clean URL and, when private, the link
 * token and its end (unix s); c answered with an error otherwise. 0 or -EINVAL. */
typedef void (*wk_preview_done_fn)(wk_call *c, const char *url, const char *token, int64_t exp);
int wk_preview_publish(wk_call *c, wk_box *b, unsigned port, int64_t exp_in,
                       wk_preview_done_fn done);
int wk_preview_start(wk_ctx *ctx);
void wk_preview_stop(wk_ctx *ctx);
/* Any thread (the heartbeat's): bytes moved per team through the ingress, as of the last
 * tick, JSON {"<team>": {"in": n, "out": n}} (at most 64 teams). */
void wk_preview_beat_bytes(char *buf, size_t n);
/* Any thread: local hops served (sockets passed to a gateway), as of the last tick. */
uint64_t wk_preview_local_hops(void);

/* host.c */
int wk_host_start(wk_ctx *ctx);
void wk_host_stop(wk_ctx *ctx);
/* The disk offered and held (sandboxes + snapshots) into the heartbeat; loop thread. */
void wk_host_disk_publish(wk_ctx *ctx);

#endif
