/* error.h - moved to core/error.h. A forwarding header for branches begun before
 * the move; removed once they have landed. */
#include "core/error.h"
