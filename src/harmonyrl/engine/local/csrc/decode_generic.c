/* kernels.h for any CPU (the compiler's baseline instruction set). */
#define ROWS_FN hrl_rows_generic
#include "kernels.h"
