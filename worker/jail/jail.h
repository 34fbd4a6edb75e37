/* The jail isolation driver (Linux namespaces, overlay root filesystem, seccomp,
 * cgroups; see worker/README.md), as an operations table of driver.h. */
#ifndef WK_JAIL_H
#define WK_JAIL_H

#include "driver.h"

extern const wk_driver_ops wk_jail_driver;

#endif
