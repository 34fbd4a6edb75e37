/* sf_bev: what libevent's bufferevents need beside their own API (sf_bev.h). */
#include "sf_bev.h"

#include <event2/event.h>

void sf_bev_no_timeouts(struct bufferevent *bev)
{
    short was = bufferevent_get_enabled(bev);

    /* a direction's timeout is removed, stored one included, only while its event is
     * pending (event_remove_timer); both are for this moment, and back as they were after */
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    bufferevent_set_timeouts(bev, NULL, NULL);
    bufferevent_disable(bev, (short)(~was & (EV_READ | EV_WRITE)));
}
