// A shared object without the entry symbol: the loader must say so.
#include "pinstage/export.h"

extern "C" PINSTAGE_API int not_a_pinstage_plugin(void) { return 42; }
