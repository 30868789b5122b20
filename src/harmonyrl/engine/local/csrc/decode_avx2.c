/* kernels.h for x86-64 CPUs with AVX2 and FMA (decode.c picks it at run time); empty elsewhere. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <math.h>
#include <stdint.h>
#include <string.h>
#pragma GCC target("avx2,fma")
#define ROWS_FN hrl_rows_avx2
#include "kernels.h"
#endif
