// pinstage::version(): the string compiled into libpinstage_base (include/pinstage/version.h).
#include "pinstage/version.h"

namespace pinstage {

const char* version() noexcept { return PINSTAGE_VERSION_STRING; }

}  // namespace pinstage
