/* Built when CUDA is off (-DLOIP_CUDA=OFF or no nvcc): the CUDA entry points report no device. */
#include "loip.h"

LOIP_API int32_t loip_cuda_device_count(void) { return 0; }
