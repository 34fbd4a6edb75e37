/* Team templates in Redis (schemas/redis-keys.md): the scheduler writes a template's record
 * when sandbox_template_create is accepted, the building worker its status and log, the
 * scheduler and the CLI read them. Keys of one team share its hash tag. */
#ifndef SF_TEMPLATES_H
#define SF_TEMPLATES_H

#include "sf_store.h" /* the key layout */


#define SF_TEMPLATE_LOG_MAX (64 * 1024) /* bytes of build log kept per template */
#define SF_TEMPLATES_PER_TEAM 16        /* templates one team may hold */

#endif
