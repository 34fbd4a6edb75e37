/* The drivers this worker build has, by name (the `driver` setting). */
#include "worker.h"

#include <string.h>

#include "jail.h"
#include "qemu.h"

static const wk_driver_ops *const drivers[] = {
    &wk_jail_driver,
    &wk_qemu_driver,
};

const wk_driver_ops *wk_driver_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (!strcmp(drivers[i]->name, name))
            return drivers[i];
    return NULL;
}

const char *wk_driver_names(void)
{
    return "jail, qemu";
}
