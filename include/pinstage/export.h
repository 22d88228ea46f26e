// Symbol visibility: the library builds with -fvisibility=hidden and exports only what
// carries PINSTAGE_API.
#pragma once

#if defined(PINSTAGE_BUILDING_LIBRARY)
#define PINSTAGE_API __attribute__((visibility("default")))
#else
#define PINSTAGE_API
#endif
