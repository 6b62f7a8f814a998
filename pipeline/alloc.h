/* alloc.h - moved to core/alloc.h. A forwarding header for branches begun before
 * the move; removed once they have landed. */
#include "core/alloc.h"
