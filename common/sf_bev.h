/* sf_bev: what libevent's bufferevents need beside their own API. */
#ifndef SF_BEV_H
#define SF_BEV_H

#include <event2/bufferevent.h>

/* Ends bev's read and write timeouts for good, whatever it has enabled. (libevent 2.1's
 * bufferevent_set_timeouts(bev, NULL, NULL) leaves the old timeout on a direction that is
 * not enabled at that moment; a persistent event re-arms it each time it fires, so a relay
 * that cleared its setup deadline was still cut once it had been silent that long.) */
void sf_bev_no_timeouts(struct bufferevent *bev);

#endif
