/* sf_curl.c: libcurl multi (socket API) on libevent. One event per socket libcurl asks us to
 * watch, one timer for libcurl's timeouts; finished transfers are reported through their
 * done callbacks. */
#include "sf_curl.h"

#include <errno.h>
#include <stdlib.h>

struct sf_curl {
    struct event_base *base;
    CURLM *multi;
    struct event *timer;
    int running;   /* transfers added and not finished */
};

typedef struct xfer {
    sf_curl_done done;
    void *arg;
} xfer;

typedef struct sock {
    struct event *ev;
} sock;

static void check_done(sf_curl *h)
{
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(h->multi, &left))) {
        CURL *easy = msg->easy_handle;
        CURLcode result = msg->data.result;
        xfer *x = NULL;

        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
        curl_multi_remove_handle(h->multi, easy);
        curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
        h->running--;
        if (x) {
            sf_curl_done done = x->done;
            void *arg = x->arg;
            free(x);
            done(arg, result); /* may add or remove transfers: the loop reads on */
        }
    }
}

static void on_socket_event(evutil_socket_t fd, short what, void *arg)
{
    sf_curl *h = arg;
    int action = ((what & EV_READ) ? CURL_CSELECT_IN : 0) | ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
    int still;

    curl_multi_socket_action(h->multi, fd, action, &still);
    check_done(h);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    sf_curl *h = arg;
    int still;

    curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &still);
    check_done(h);
}

static int socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    sf_curl *h = userp;
    sock *s = socketp;
    short kind;

    if (what == CURL_POLL_REMOVE) {
        if (s) {
            event_free(s->ev);
            free(s);
            curl_multi_assign(h->multi, fd, NULL);
        }
        return 0;
    }
    kind = (short)(((what & CURL_POLL_IN) ? EV_READ : 0) | ((what & CURL_POLL_OUT) ? EV_WRITE : 0) |
                   EV_PERSIST);
    if (!s) {
        if (!(s = calloc(1, sizeof(*s))))
            return -1;
        curl_multi_assign(h->multi, fd, s);
    } else {
        event_free(s->ev);
    }
    if (!(s->ev = event_new(h->base, fd, kind, on_socket_event, h)) || event_add(s->ev, NULL) < 0)
        return -1;
    return 0;
}

static int timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    sf_curl *h = userp;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};

    if (timeout_ms < 0)
        return evtimer_del(h->timer) < 0 ? -1 : 0;
    return evtimer_add(h->timer, &tv) < 0 ? -1 : 0; /* 0 ms: on the next loop turn */
}

sf_curl *sf_curl_new(struct event_base *base)
{
    sf_curl *h = calloc(1, sizeof(*h));

    if (!h)
        return NULL;
    h->base = base;
    if (!(h->multi = curl_multi_init()) || !(h->timer = evtimer_new(base, on_timer, h)))
        goto fail;
    curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
    curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
    curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
    curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
    curl_multi_setopt(h->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX); /* HTTP/2 */
    return h;
fail:
    sf_curl_free(h);
    return NULL;
}

void sf_curl_free(sf_curl *h)
{
    if (!h)
        return;
    if (h->multi)
        curl_multi_cleanup(h->multi); /* the easy handles are the callers' to clean up */
    if (h->timer)
        event_free(h->timer);
    free(h);
}

int sf_curl_add(sf_curl *h, CURL *easy, sf_curl_done done, void *arg)
{
    xfer *x = malloc(sizeof(*x));

    if (!x)
        return -ENOMEM;
    x->done = done;
    x->arg = arg;
    curl_easy_setopt(easy, CURLOPT_PRIVATE, (char *)x);
    if (curl_multi_add_handle(h->multi, easy) != CURLM_OK) {
        curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
        free(x);
        return -EIO;
    }
    h->running++;
    return 0;
}

void sf_curl_remove(sf_curl *h, CURL *easy)
{
    xfer *x = NULL;

    if (!h || !easy)
        return;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    if (!x)
        return; /* not running */
    curl_multi_remove_handle(h->multi, easy);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
    free(x);
    h->running--;
}

int sf_curl_running(const sf_curl *h)
{
    return h ? h->running : 0;
}
