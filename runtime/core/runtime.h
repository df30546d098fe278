/* Internal: the kernel variant in use, shared by the executor and the single ops. */
#ifndef LOIP_RUNTIME_H
#define LOIP_RUNTIME_H

#include "cpu/kernels.h"

const loip_kernels *loip_kernels_current(void);

#endif
