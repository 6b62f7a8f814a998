/* fileio.h - moved to core/fileio.h. A forwarding header for branches begun before
 * the move; removed once they have landed. */
#include "core/fileio.h"
