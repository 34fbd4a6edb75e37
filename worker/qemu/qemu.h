/* The qemu isolation driver: each sandbox a QEMU microVM (-M microvm) restored
 * from a template snapshot, driven over QMP, its agent on virtio-serial (see
 * worker/README.md), as an operations table of driver.h. */
#ifndef WK_QEMU_H
#define WK_QEMU_H

#include "driver.h"

extern const wk_driver_ops wk_qemu_driver;

#endif
